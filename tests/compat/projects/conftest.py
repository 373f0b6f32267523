"""The sample projects are run by the tests in ``tests/compat``, never collected as tests.

``pytestproj`` is a whole pytest suite of its own (with its own ``pytest.ini`` and a
conftest that enables the plugin): ``tests/compat/test_contrib_pytest.py`` runs it in a
subprocess, the way its users would.
"""

collect_ignore = ["pytestproj"]
