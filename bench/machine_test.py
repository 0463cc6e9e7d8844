"""The benchmark scripts on CPUs of every ISA this machine kind comes with: bench/machine.py's ISA
rule, and scripts/bench-kernels' choice of figures on an AVX2-only CPU (where it once failed with
KeyError 'BM_MaxSimCpu/fp16/avx512/threads:1'), from a real tessera-bench-maxsim run.
  machine_test.py --bench_maxsim build/bin/tessera-bench-maxsim
"""
import argparse
import importlib.machinery
import importlib.util
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import machine  # noqa: E402

BENCH_MAXSIM = None


def load_bench_kernels():
    loader = importlib.machinery.SourceFileLoader("bench_kernels",
                                                  os.path.join(ROOT, "scripts", "bench-kernels"))
    spec = importlib.util.spec_from_loader("bench_kernels", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


class BestIsaTest(unittest.TestCase):
    def test_zen4_flags_give_avx512(self):
        self.assertEqual(machine.best_isa(
            "fpu avx avx2 fma f16c avx512f avx512dq avx512bw avx512vl avx512_vnni".split()),
            "avx512")

    def test_zen3_flags_give_avx2(self):
        self.assertEqual(machine.best_isa("fpu sse4_2 avx avx2 fma f16c bmi2".split()), "avx2")

    def test_partial_avx512_is_not_enough(self):
        # AVX-512F without BW/VL (Knights Landing) runs the AVX2 kernels, as the C++ rule says.
        self.assertEqual(machine.best_isa("avx2 fma f16c avx512f".split()), "avx2")

    def test_no_avx2_gives_portable(self):
        self.assertEqual(machine.best_isa("fpu sse4_2 avx".split()), "portable")
        self.assertEqual(machine.best_isa("avx2 f16c".split()), "portable")  # no FMA

    def test_describe_names_this_cpu(self):
        info = machine.describe()
        self.assertTrue(info["cpu_model"])
        self.assertIn(info["cpu_isa"], ("avx512", "avx2", "portable"))
        self.assertEqual(info["cpu_isa"], machine.best_isa(machine.cpu_flags()))


class BenchKernelsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.bench_kernels = load_bench_kernels()
        # One real run of every kernel family this CPU has, as bench-kernels filters it.
        cls.benchmarks = cls.bench_kernels.run_benchmark(BENCH_MAXSIM, [
            "--benchmark_filter=BM_FmaPeak|BM_MaxSimSgemmBaseline/threads:1|"
            "BM_MaxSimCpu/fp(16|32)/[a-z0-9]+/threads:1",
            "--benchmark_min_time=0.01"])

    def without(self, *isas):
        """The run as a CPU without `isas` reports it: their benchmarks errored out."""
        return {name: b for name, b in self.benchmarks.items()
                if not any(f"/{isa}" in name for isa in isas)}

    def test_this_cpu_uses_its_widest_kernels(self):
        figures = self.bench_kernels.maxsim_figures(self.benchmarks, 1)
        self.assertEqual(figures["maxsim.isa"], machine.best_isa(machine.cpu_flags()))
        self.assertGreater(figures["maxsim.gflops"], 0)

    def test_avx2_only_cpu(self):
        if machine.best_isa(machine.cpu_flags()) == "portable":
            self.skipTest("this CPU runs no AVX2 kernels")
        figures = self.bench_kernels.maxsim_figures(self.without("avx512"), 1)
        self.assertEqual(figures["maxsim.isa"], "avx2")
        self.assertEqual(figures["maxsim.peak_isa"], "avx2")
        self.assertEqual(figures["maxsim.gflops"],
                         self.benchmarks["BM_MaxSimCpu/fp16/avx2/threads:1"]["gflops"])
        self.assertEqual(figures["maxsim.peak_gflops"],
                         self.benchmarks["BM_FmaPeak/avx2"]["gflops"])
        self.assertAlmostEqual(figures["maxsim.fraction_of_peak"],
                               figures["maxsim.gflops"] / figures["maxsim.peak_gflops"])

    def test_cpu_without_avx2(self):
        figures = self.bench_kernels.maxsim_figures(self.without("avx512", "avx2"), 1)
        self.assertEqual(figures["maxsim.isa"], "portable")
        self.assertIsNone(figures["maxsim.peak_gflops"])
        self.assertIsNone(figures["maxsim.fraction_of_peak"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bench_maxsim", required=True)
    args, rest = parser.parse_known_args()
    BENCH_MAXSIM = args.bench_maxsim
    unittest.main(argv=[sys.argv[0]] + rest)
