"""The ``akadze`` command line (``cli.main``) and the process plumbing it shares with
``akadze-compat`` (``cli.support``)."""
