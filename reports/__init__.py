"""Reports: merged JUnit, the Markdown matrix, the gate policy and its verdict, the release report."""
