"""The README's reading path ("Read these files first") stays short and says its true length:
the files its table links exist, together they are under 1,500 lines, and the sentence above the
table gives their `wc -l` total (issue #31)."""

import re

from repo_root import ROOT


def test_the_reading_path_is_short_and_counted():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Read these files first", 1)[1].split("\nNext,", 1)[0]
    files = re.findall(r"^\| \[([^\]]+)\]\(", section, flags=re.M)
    assert len(files) >= 5, files
    lines = sum(len((ROOT / f).read_text().splitlines()) for f in files)
    stated = int(re.search(r"together they are ([\d,]+) lines", section).group(1).replace(",", ""))
    assert stated == lines, f"the README says {stated} lines, the files have {lines}"
    assert lines < 1500, f"the reading path grew to {lines} lines: shorten it or choose smaller files"
