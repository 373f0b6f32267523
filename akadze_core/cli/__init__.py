"""The ``akadze`` command line (``cli.main``, with ``cli.jobs`` and ``cli.schedules``; what its
commands share is ``cli.base``) and the process plumbing it shares with ``akadze-compat``
(``cli.support``)."""
