"""attnjit.check / compile / tune / cpu_describe and the error classes,
over the C API; and the ctypes structs' layouts against the C compiler's."""
import os
import shutil
import subprocess
import tempfile

import pytest

import attnjit
from attnjit import _capi

SPEC = "attention forward flash { dtype = bf16 head_dim = 64 mask = causal(top_left) }"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_check_gives_the_canonical_text():
    text = attnjit.check(SPEC)
    assert text.startswith("attention forward flash {")
    assert "head_dim_v = 64" in text and "mask = causal(top_left)" in text
    assert attnjit.check(text) == text


def test_compile_ptx_and_launch_contract():
    k = attnjit.compile(SPEC, target="sm_90")
    assert k.emit == "ptx" and k.target == "sm_90"
    assert ".entry " + k.entry in k.code
    stage = k.stages[0]
    assert stage["params"][0] == ("q", "ptr")
    assert stage["grid"][0][0] == "seq_q" and stage["grid"][0][1] == k.schedule["block_m"]
    assert k.schedule["block_m"] > 0 and stage["block"][0] == 32 * k.schedule["warps"]


def test_compile_cpu_llvm_ir_and_two_stage_backward():
    k = attnjit.compile("attention backward efficient { dtype = f32 head_dim = 32 }",
                        target="cpu")
    assert k.emit == "llvm_ir" and "define" in k.code
    # the cpu backward's two plans (docs/cpu.md "The backward")
    assert [s["plan"] for s in k.stages] == ["split", "split", "fused"]
    assert k.stages[2]["grid"][0] == ("heads_kv", 1)
    assert ("workspace", "ptr") in k.stages[2]["params"]
    k = attnjit.compile("attention backward efficient { dtype = f32 head_dim = 32 bias = add }",
                        target="cpu")
    assert [s["plan"] for s in k.stages] == ["every", "every", "unused"]
    k = attnjit.compile("attention backward efficient { dtype = f32 head_dim = 32 }",
                        target="sim")
    assert len(k.stages) == 2 and {s["plan"] for s in k.stages} == {"every"}


def test_errors():
    with pytest.raises(attnjit.ParseError) as e:
        attnjit.check("attention forward flash { dtype = bf17 }")
    assert e.value.status == "AJ_ERR_PARSE" and e.value.code == 2
    assert "1:35: expected a dtype" in e.value.message
    with pytest.raises(attnjit.VerifyError):
        attnjit.check("attention forward flash { dtype = f32 head_dim = 64 bias = add }")
    with pytest.raises(attnjit.InvalidArgError, match="sm_75"):
        attnjit.compile(SPEC, target="sm_75")
    assert issubclass(attnjit.ParseError, attnjit.Error)


def test_cpu_describe(monkeypatch):
    """The cpu paths as attnjit info prints them, following AJ_CPU_AMX and
    AJ_CPU_ISA at each call."""
    lines = attnjit.cpu_describe()
    assert list(lines) == ["features", "vectors", "bf16", "f16", "AMX bf16", "AMX f16"]
    assert "CPUID" in lines["features"] and "floats" in lines["vectors"]
    monkeypatch.setenv("AJ_CPU_AMX", "standin")
    lines = attnjit.cpu_describe()
    assert lines["AMX bf16"].startswith("standin: ") and lines["AMX f16"].startswith("standin")
    monkeypatch.setenv("AJ_CPU_AMX", "off")
    monkeypatch.setenv("AJ_CPU_ISA", "avx2")
    lines = attnjit.cpu_describe()
    assert lines["vectors"].startswith("8 floats") and lines["AMX bf16"] == "off: AJ_CPU_AMX=off"
    monkeypatch.setenv("AJ_CPU_AMX", "tiles")
    assert "expected auto, off, standin or native" in attnjit.cpu_describe()["features"]


def test_tune_on_cpu():
    results = attnjit.tune("attention forward flash { dtype = f32 head_dim = 16 }", "cpu",
                           batch=1, heads_q=1, seq_q=64, repeats=1, persist=False)
    timed = [r for r in results if r["timed"]]
    assert timed and all(r["median_ms"] > 0 for r in timed)
    assert [r["median_ms"] for r in timed] == sorted(r["median_ms"] for r in timed)
    assert all(r["warpgroups"] == 0 for r in results)   # the cpu has no wgmma kernels


def test_tune_wgmma_on_sim():
    """wgmma=True puts the Hopper kernels among a flash op's candidates on
    sim; a bad value is an Error naming the choices."""
    results = attnjit.tune("attention forward flash { dtype = f16 head_dim = 16 }", "sim",
                           batch=1, heads_q=1, seq_q=16, repeats=1, persist=False, wgmma=True)
    kinds = {(r["warpgroups"], r["producer"]) for r in results if r["timed"]}
    assert {(0, 0), (1, 0), (2, 0), (1, 1), (2, 1)} <= kinds
    with pytest.raises(attnjit.InvalidArgError, match="want True or False"):
        attnjit.tune("attention forward flash { dtype = f16 head_dim = 16 }", "sim", wgmma="yes")


def test_struct_layouts_match_c():
    """Every ctypes struct has the C struct's size and field offsets."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to compare the layouts with")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "attnjit/attnjit.h"',
             "int main(void) {"]
    for cname, cls in _capi.STRUCTS.items():
        lines.append('printf("%s %%zu\\n", sizeof(%s));' % (cname, cname))
        for field in cls._fields_:
            lines.append('printf("%s.%s %%zu\\n", offsetof(%s, %s));'
                         % (cname, field[0], cname, field[0]))
    lines.append("return 0; }")
    tmp = os.environ.get("PYTEST_TMP") or tempfile.mkdtemp(prefix="aj_layout")
    src, exe = os.path.join(tmp, "aj_layout.c"), os.path.join(tmp, "aj_layout")
    with open(src, "w") as f:
        f.write("\n".join(lines))
    subprocess.run([cc, "-I", os.path.join(ROOT, "include"), src, "-o", exe], check=True)
    want = dict(line.split() for line in subprocess.run([exe], capture_output=True, text=True,
                                                        check=True).stdout.splitlines())
    for cname, cls in _capi.STRUCTS.items():
        assert int(want[cname]) == __import__("ctypes").sizeof(cls), cname
        for field in cls._fields_:
            assert int(want["%s.%s" % (cname, field[0])]) == getattr(cls, field[0]).offset, \
                "%s.%s" % (cname, field[0])
