"""Oban for Python, for comparison. These modules run only in the separate Oban virtualenv
(``bench.oban_side`` starts them there); nothing in akadze imports them."""
