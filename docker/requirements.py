"""Print selgate's runtime and test requirements from pyproject.toml, one a line.

The images install dependencies in a layer of their own, before the sources are copied,
so that editing the sources reuses it; pyproject.toml stays the one list of them.
"""

import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
print(*project["dependencies"], *project["optional-dependencies"]["test"], sep="\n")
