"""Loading a HuggingFace checkpoint imports nothing it does not use: the re-layout's dry run
(tensors without data) once went through torch.cat on the meta device, whose first call imports
torch._dynamo, about a second of every `from_pretrained` (weights_tools/hf.py `_cat`)."""

import subprocess
import sys

from tests._models import make_bert


def test_from_pretrained_does_not_import_torch_dynamo(tmp_path):
    make_bert(tmp_path, hidden=32, heads=2, layers=2, seed=4)  # Q, K, V fused: the concatenation
    code = (
        "import sys, ftbert\n"
        f"enc = ftbert.Encoder.from_pretrained({str(tmp_path)!r})\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo'))[:3])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
