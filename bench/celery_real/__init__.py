"""Real Celery for comparison. These modules run only in the separate Celery virtualenv
(``bench.celery_side`` starts them there); nothing in akadze imports them."""
