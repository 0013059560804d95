"""A check leaves the process as it found it: after check_reload, everyday
CPU work (convolutions, mkldnn tensors, BLAS, sorting, serialization, numpy)
runs, and a second check still works, all in one process. The process is a
child, so a crash (an abort from a deleter) fails this test instead of
killing pytest."""
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    r"""
    import io
    import torch
    import torch.utils.mkldnn
    import reloadsafe

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(16, 32), requires_grad=False)

        def process_weights_after_loading(self):
            self.weight.detach().mul_(0.5)

        def forward(self, x):
            return torch.mm(x, self.weight.t())

    def check(tag):
        report = reloadsafe.check_reload(Layer, torch.randn(4, 32), reloads=3)
        assert report.ok, report.table()
        print(tag, "ok", flush=True)

    check("check 1")

    # Convolutions on the CPU (oneDNN where torch uses it).
    conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        for _ in range(3):
            y = conv(x)
        y.sum().item()
    z = torch.nn.functional.conv1d(torch.randn(2, 4, 32), torch.randn(6, 4, 5))
    del y, z
    print("conv ok", flush=True)

    # mkldnn tensors and an mkldnn module.
    m = x.to_mkldnn()
    back = m.to_dense()
    assert torch.equal(back, x)
    mk = torch.utils.mkldnn.to_mkldnn(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval())
    with torch.no_grad():
        out = mk(x.to_mkldnn()).to_dense()
    del m, back, mk, out
    lin = torch.utils.mkldnn.to_mkldnn(torch.nn.Linear(32, 8).eval())
    with torch.no_grad():
        lin(torch.randn(4, 32).to_mkldnn()).to_dense()
    del lin
    print("mkldnn ok", flush=True)

    # Everyday CPU work.
    a = torch.randn(256, 256)
    (a @ a).sort(dim=1)
    torch.linalg.qr(a)
    buf = io.BytesIO()
    torch.save({"a": a}, buf)
    buf.seek(0)
    assert torch.equal(torch.load(buf)["a"], a)
    n = a.numpy()
    assert torch.from_numpy(n.copy()).shape == a.shape
    big = torch.empty(8 << 20, dtype=torch.uint8)  # a large (mmap'd) allocation
    big.fill_(1)
    del big, a, n
    import gc
    gc.collect()
    print("cpu work ok", flush=True)

    check("check 2")

    # And the same work once more after the second check.
    with torch.no_grad():
        conv(x)
    x.to_mkldnn().to_dense()
    print("after ok", flush=True)
    """
)


def test_a_check_leaves_the_process_usable_for_conv_mkldnn_and_a_second_check():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"the child exited with {proc.returncode}:\n{out[-4000:]}"
    for step in ("check 1 ok", "conv ok", "mkldnn ok", "cpu work ok", "check 2 ok", "after ok"):
        assert step in proc.stdout, (step, out[-4000:])
