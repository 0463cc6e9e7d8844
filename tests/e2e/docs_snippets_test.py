"""The client pages under docs/clients run as written: every ```python block of a page, in order,
as one script in a fresh interpreter against a real tessera-server, with `127.0.0.1:50051`
replaced by that server's address (the only change; the test asserts each page holds it). A block
right after a `<!-- not run: REASON -->` line is skipped (e.g. one that downloads a model).
A page whose first block imports a module this Python lacks (pylate.md needs torch and pylate) is
skipped, naming the module.

    /usr/bin/python3 tests/e2e/docs_snippets_test.py --server build/bin/tessera-server

CTest runs it with the Python of the venv where the wheel is installed (TESSERA_PYTHON_INSTALLED=1).
"""

import importlib.util
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402

DOCS = os.path.join(e2e_util.REPO_ROOT, "docs", "clients")
ADDRESS = "127.0.0.1:50051"
_BLOCK = re.compile(r"(<!-- not run:[^\n]*-->\n)?^```(\w*)\n(.*?)^```$",
                    re.MULTILINE | re.DOTALL)
# Modules a page may need beyond the client's own dependencies.
_OPTIONAL = ("torch", "pylate")


def python_blocks(page):
    """[(line number, code)] of the page's python blocks that run."""
    with open(os.path.join(DOCS, page), encoding="utf-8") as f:
        text = f.read()
    blocks = []
    for match in _BLOCK.finditer(text):
        if match.group(2) == "python" and not match.group(1):
            blocks.append((text.count("\n", 0, match.start(3)) + 1, match.group(3)))
    return blocks


class DocsSnippetsTest(e2e_util.ServerTestCase):

    def run_page(self, page):
        blocks = python_blocks(page)
        self.assertTrue(blocks, f"{page} has no python block")
        missing = [m for m in _OPTIONAL
                   if re.search(rf"^\s*(import|from) {m}\b", "".join(c for _, c in blocks),
                                re.MULTILINE) and importlib.util.find_spec(m) is None]
        if missing:
            self.skipTest(f"{page} needs {', '.join(missing)}, not importable here")
        self.assertIn(ADDRESS, "".join(code for _, code in blocks),
                      f"{page} no longer names {ADDRESS}; update the test")
        # One script: each block marked with its line in the page, so a failure names it.
        script = "".join(f"# --- {page}:{line}\n{code.replace(ADDRESS, self.server.address)}"
                         for line, code in blocks)
        environment = dict(os.environ)
        if not e2e_util.INSTALLED:
            environment["PYTHONPATH"] = os.pathsep.join(
                [os.path.join(e2e_util.REPO_ROOT, "client", "python")] +
                ([environment["PYTHONPATH"]] if environment.get("PYTHONPATH") else []))
        with tempfile.TemporaryDirectory(prefix="tessera-docs-") as work_dir:
            path = os.path.join(work_dir, page.replace(".md", "_snippets.py"))
            with open(path, "w", encoding="utf-8") as f:
                f.write(script)
            done = subprocess.run([sys.executable, path], cwd=work_dir, env=environment,
                                  capture_output=True, text=True, timeout=240)
        self.assertEqual(done.returncode, 0,
                         f"the python blocks of docs/clients/{page} failed:\n"
                         f"{done.stdout[-3000:]}\n{done.stderr[-4000:]}")
        return done.stdout

    def test_python_page(self):
        out = self.run_page("python.md")
        self.assertIn("SERVING", out)
        self.assertIn("[True, False]", out)

    def test_pylate_page(self):
        out = self.run_page("pylate.md")
        self.assertIn("(60, 128)", out)

    def test_not_run_marker_skips_only_the_next_block(self):
        blocks = python_blocks("pylate.md")
        self.assertFalse(any("models.ColBERT" in code for _, code in blocks))
        self.assertTrue(any("TesseraIndex(" in code for _, code in blocks))


if __name__ == "__main__":
    e2e_util.main()
