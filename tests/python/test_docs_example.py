"""docs/python.md's training step runs as written and trains."""
import math
import os
import re

import pytest

pytest.importorskip("torch")
DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "python.md")


def test_training_step_example():
    text = open(DOC).read()
    section = text[text.index("## A training step"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope = {}
    exec(compile(code, "docs/python.md", "exec"), scope)
    losses = scope["losses"]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0], losses
