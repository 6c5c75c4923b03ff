"""When a test counts as done, for every plugin that counts tests (the cut record, the
progress line): kept free of torch so that a plugin can import it cheaply."""


def outcome_known(report) -> bool:
    """A test's outcome is known at its call report, at a setup that did not pass (skipped or
    errored) or at any failure (xdist reports a crashed worker's test once, as failed): the
    moment the JUnit holds it, so that a cut run never counts fewer tests done than its JUnit."""
    return report.when == "call" or (report.when == "setup" and not report.passed) or report.failed
