"""Smoke test of the load test (scripts/load): runs it with tiny bounds against the real server and
checks its verdict and its JSON — no write lost, no error at one stream, every key present with
sane values. A check that the harness works, not a performance measurement."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402

LEVEL_KEYS = ("concurrency", "qps", "search_qps", "p50_ms", "p95_ms", "p99_ms", "errors",
              "errors_by_code")
TOP_KEYS = ("levels", "rss_mb_start", "rss_mb_end", "rss_mb_max", "rss_samples",
            "acknowledged_writes", "lost_writes", "docs", "seconds_per_level", "nproc",
            "cpu_model")


class LoadSmokeTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.work_dir = tempfile.mkdtemp(prefix="tessera-load-smoke-")
        cls.json_path = os.path.join(cls.work_dir, "load.json")
        command = [sys.executable, os.path.join(e2e_util.REPO_ROOT, "scripts", "load"),
                   "--server", e2e_util.SERVER_BINARY, "--server-arg=--threads=2",
                   "--docs", "2000", "--seconds", "3", "--levels", "1,4", "--processes", "2",
                   "--ingest-streams", "2", "--work-dir", cls.work_dir, "--json", cls.json_path]
        cls.run_result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        timeout=150)
        cls.output = cls.run_result.stdout.decode("utf-8", "replace")
        sys.stderr.write(cls.output)
        cls.report = None
        if os.path.exists(cls.json_path):
            with open(cls.json_path) as f:
                cls.report = json.load(f)

    @classmethod
    def tearDownClass(cls):
        import shutil
        shutil.rmtree(cls.work_dir, ignore_errors=True)

    def setUp(self):
        self.assertIsNotNone(self.report, f"no JSON written:\n{self.output[-4000:]}")

    def test_exits_zero_and_loses_nothing(self):
        self.assertEqual(self.run_result.returncode, 0, self.output[-4000:])
        self.assertEqual(self.report["lost_writes"], 0)
        self.assertEqual(self.report["problems"], [])
        self.assertGreater(self.report["acknowledged_writes"], 2000)  # the ingest and then some
        self.assertEqual(self.report["ingest"]["docs_acknowledged"], 2000)
        self.assertEqual(self.report["server"]["exit_code"], 0)

    def test_keys_and_sane_values(self):
        for key in TOP_KEYS:
            self.assertIn(key, self.report)
        self.assertEqual(self.report["docs"], 2000)
        self.assertEqual(self.report["seconds_per_level"], 3)
        self.assertGreaterEqual(self.report["nproc"], 1)
        self.assertTrue(self.report["cpu_model"])
        levels = self.report["levels"]
        self.assertEqual([level["concurrency"] for level in levels], [1, 4])
        for level in levels:
            for key in LEVEL_KEYS:
                self.assertIn(key, level)
            self.assertGreater(level["qps"], 0)
            self.assertGreater(level["search_qps"], 0)
            self.assertLessEqual(level["search_qps"], level["qps"])
            self.assertLessEqual(level["p50_ms"], level["p95_ms"])
            self.assertLessEqual(level["p95_ms"], level["p99_ms"])
            self.assertGreater(level["p50_ms"], 0)
            self.assertEqual(level["errors"], sum(level["errors_by_code"].values()))

    def test_no_errors_below_saturation(self):
        self.assertEqual(self.report["levels"][0]["errors"], 0,
                         self.report["levels"][0]["errors_by_code"])

    def test_rss_sampled(self):
        samples = self.report["rss_samples"]
        self.assertGreaterEqual(len(samples), 5)  # once a second over a run of ≥ 6 s
        times = [t for t, _ in samples]
        self.assertEqual(times, sorted(times))
        for _, mb in samples:
            self.assertGreater(mb, 1)
        self.assertGreater(self.report["rss_mb_start"], 1)
        self.assertGreater(self.report["rss_mb_end"], 1)
        self.assertGreaterEqual(self.report["rss_mb_max"], self.report["rss_mb_end"])
        self.assertGreaterEqual(self.report["rss_mb_max"], self.report["rss_mb_start"])


if __name__ == "__main__":
    e2e_util.main()
