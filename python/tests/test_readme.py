"""README.md's Python example runs as shown (on a temp dir instead of /mnt/nvme)."""

from __future__ import annotations

from conftest import REPO


def test_readme_python_example_runs(tmp_path, capsys):
    readme = (REPO / "README.md").read_text()
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) <= 12
    exec(code.replace('"/mnt/nvme/kvcache"', repr(str(tmp_path))), {})
    assert capsys.readouterr().out == "4\n"
