"""Hooks of the tests/python tests."""

import sys


def pytest_terminal_summary(terminalreporter):
    """After a session that ran test_api_properties.py: how many cases each property ran and how
    they came out (hypothesis draws a different number each run), in the summary, not as a test."""
    module = sys.modules.get("tests.python.test_api_properties")
    lines = module.case_count_lines() if module is not None else []
    if lines:
        terminalreporter.section("api properties")
        for line in lines:
            terminalreporter.write_line(line)
