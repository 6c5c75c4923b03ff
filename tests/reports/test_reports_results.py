"""Committed evidence keeps its JUnit gzipped: the gate reads junit.xml.gz as it reads junit.xml."""

import gzip

from selgate.reports.results import junit_path, load_lane

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="2">
<testcase classname="tests.test_a" name="test_ok"/>
<testcase classname="tests.test_a" name="test_bad"><failure message="boom">trace</failure></testcase>
</testsuite></testsuites>"""


def test_a_gzipped_junit_reads_like_the_plain_one(tmp_path):
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    (plain / "junit.xml").write_text(JUNIT)
    with gzip.open(packed / "junit.xml.gz", "wt") as f:
        f.write(JUNIT)
    assert junit_path(packed).name == "junit.xml.gz"
    a, b = load_lane("cpu", plain), load_lane("cpu", packed)
    assert a.counts() == b.counts() == {"pass": 1, "fail": 1, "error": 0, "skip": 0, "xfail": 0}
    assert [c.nodeid for c in a.cases] == [c.nodeid for c in b.cases]


def test_a_plain_junit_wins_over_a_stale_gzipped_one(tmp_path):
    (tmp_path / "junit.xml").write_text(JUNIT)
    with gzip.open(tmp_path / "junit.xml.gz", "wt") as f:
        f.write("not xml")
    assert junit_path(tmp_path).name == "junit.xml"
