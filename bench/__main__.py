"""``python -m bench``: see bench/README.md."""

from bench.run import main

main()
