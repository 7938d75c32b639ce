#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Add "SPDX-License-Identifier: BSD-3-Clause" to the source files named
# on the command line that lack it: C and headers a first line of their
# own, scripts after the shebang, POD a comment paragraph first.  For
# every tracked source file:
#   git ls-files '*.c' '*.h' '*.sh' '*.py' '*.pod' Makefile.am \
#       configure.ac .ci/run | xargs .ci/add-spdx.py
import sys
TAG = "SPDX-License-Identifier: BSD-3-Clause"
for path in sys.argv[1:]:
    with open(path) as f:
        text = f.read()
    if TAG in text:
        continue
    if path.endswith((".c", ".h")):
        text = "/* %s */\n" % TAG + text
    elif path.endswith(".pod"):
        text = "=for comment %s\n\n" % TAG + text
    else:
        lines = text.split("\n")
        at = 1 if lines and lines[0].startswith("#!") else 0
        lines.insert(at, "# " + TAG)
        text = "\n".join(lines)
    with open(path, "w") as f:
        f.write(text)
