"""What a benchmark figure was measured on: the CPU model and the instruction sets Tessera's kernels
can use on it. Every benchmark script records these beside its figures, because machines of one kind
differ (Zen 4 with AVX-512, Zen 3 AVX2-only) and a speed means little without them.

The ISA rule is the C++ kernels' (index/kernels/cpu_kernels.cc, CpuSupportsIsa): "avx512" needs
AVX-512 F/BW/VL/DQ with FMA and F16C, "avx2" needs AVX2 with FMA and F16C, else "portable".
"""
import os
import platform
from typing import Dict, Iterable, Set

AVX512_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "fma", "f16c")
AVX2_FLAGS = ("avx2", "fma", "f16c")
# Flags worth naming beside a figure (the ones the kernels or their next versions select on).
REPORTED_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
                  "avx2", "fma", "f16c", "avx_vnni")


def _cpuinfo_field(name: str) -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":", 1)[0].strip() == name:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_model() -> str:
    """The CPU's model name, e.g. "AMD EPYC 9R14 96-Core Processor"."""
    return _cpuinfo_field("model name") or platform.processor() or "unknown"


def cpu_flags() -> Set[str]:
    return set(_cpuinfo_field("flags").split())


def best_isa(flags: Iterable[str]) -> str:
    """The widest kernel family the scorer runs with these CPU flags: avx512, avx2 or portable."""
    flags = set(flags)
    if all(f in flags for f in AVX512_FLAGS):
        return "avx512"
    if all(f in flags for f in AVX2_FLAGS):
        return "avx2"
    return "portable"


def describe() -> Dict[str, object]:
    """The machine fields every benchmark JSON carries: cpu_model, cpu_isa, cpu_flags, cpus."""
    flags = cpu_flags()
    return {"cpu_model": cpu_model(), "cpu_isa": best_isa(flags),
            "cpu_flags": sorted(f for f in REPORTED_FLAGS if f in flags), "cpus": os.cpu_count()}
