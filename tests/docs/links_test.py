"""Every relative link of the Markdown pages resolves: the file (or folder) it names exists, and its
#anchor is a heading of that page (GitHub's slugs: lower case, punctuation dropped, spaces to
hyphens, "-1", "-2" … for repeated headings). Covers README.md and every page under docs/ and
deploy/, images included. Links inside code blocks and to other sites are not checked.

    python3 tests/docs/links_test.py
"""

import os
import re
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)


def pages():
    """Repository-relative paths of the Markdown pages checked."""
    found = ["README.md"]
    for top in ("docs", "deploy"):
        for directory, _, files in os.walk(os.path.join(ROOT, top)):
            found += [os.path.relpath(os.path.join(directory, f), ROOT)
                      for f in sorted(files) if f.endswith(".md")]
    return found


def without_code(text):
    """The page with fenced blocks and inline code blanked (line numbers kept)."""
    text = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return _CODE.sub("", text)


def slug(heading):
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path):
    """The anchors GitHub gives the headings of the page at path."""
    with open(path, encoding="utf-8") as f:
        text = without_code(f.read())
    seen = {}
    result = set()
    for match in _HEADING.finditer(text):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    result |= set(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text))
    return result


def broken_links(page):
    """[(line, target, why)] for the page's relative links that do not resolve."""
    path = os.path.join(ROOT, page)
    with open(path, encoding="utf-8") as f:
        text = without_code(f.read())
    problems = []
    for match in _LINK.finditer(text):
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, mailto:, …
            continue
        line = text.count("\n", 0, match.start()) + 1
        file_part, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(resolved):
            problems.append((line, target, f"{os.path.relpath(resolved, ROOT)} does not exist"))
            continue
        if anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
            problems.append((line, target, f"no heading of {os.path.relpath(resolved, ROOT)} has "
                                           f"the anchor '{anchor}'"))
    return problems


class LinksTest(unittest.TestCase):

    def test_slugs_follow_github(self):
        self.assertEqual(slug("Scale: one shard from 10k to 1M documents"),
                         "scale-one-shard-from-10k-to-1m-documents")
        self.assertEqual(slug("Sparse lane (BM25)"), "sparse-lane-bm25")
        self.assertEqual(slug("Index — `scripts/bench-index --json FILE`"),
                         "index--scriptsbench-index---json-file")

    def test_every_relative_link_resolves(self):
        checked = pages()
        self.assertIn(os.path.join("docs", "results.md"), checked)
        problems = [f"{page}:{line}: ({target}) {why}"
                    for page in checked for line, target, why in broken_links(page)]
        self.assertEqual(problems, [], "broken links:\n" + "\n".join(problems))

    def test_readme_links_into_the_results_sections(self):
        with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
            readme = f.read()
        linked = set(re.findall(r"docs/results\.md#([\w-]+)", readme))
        self.assertTrue({"summary", "quality-on-real-data"} <= linked, sorted(linked))


if __name__ == "__main__":
    unittest.main()
