"""scripts/bench_spec.py --row-cost: the price of a verification forward of
n rows, measured on a real (tiny) model, one table row per n."""


import pytest
from conftest import load_script

from intdet.convert import convert


def test_row_cost_table(tmp_path, tiny_llama_hf, capsys):
    model = convert(tiny_llama_hf, str(tmp_path / "tiny"), progress=False)
    bs = load_script("bench_spec")
    assert bs.main(["--row-cost", "--max-rows", "3", "-m", model, "--threads", "1"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert [int(r.split("|")[1]) for r in rows] == [1, 2, 3]
    ms = [float(r.split("|")[2]) for r in rows]
    assert all(m > 0 for m in ms)
    assert rows[0].split("|")[3].strip() == "1.00"


def test_row_cost_rejects_bad_max_rows(capsys):
    with pytest.raises(SystemExit) as e:
        load_script("bench_spec").main(["--row-cost", "--max-rows", "0"])
    assert e.value.code == 2 and "--max-rows" in capsys.readouterr().err
