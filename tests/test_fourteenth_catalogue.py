"""Faults the fourteenth bad-input catalogue found (tried by someone who did not write the code, on
89e1a62) that have no better home: each test fails on the code before its fix. The others are
beside the code they test: t01 in tests/controller/test_alerts.py and test_start_pass_k.py, t02 in
tests/test_silent_results.py, t03-t05 in tests/config/test_command_line.py, t06-t08 in
tests/metrics/test_plot.py, t09 in tests/data/test_dataset.py, t10 in
tests/controller/test_checkpoint.py, t13-t16 and t24-t26 in tests/config/test_config.py, t27 in
tests/metrics/test_row_file.py."""

from rlpost.cli import main


def test_rlpost_data_refuses_the_data_keys_its_task_does_not_read(tmp_path, capsys):
    """t20: `rlpost data arithmetic data.max_prompt_length=2 data.shuffle=false` wrote every row and
    ignored both (a run would have dropped every prompt); the keys the task reads still work."""
    out = tmp_path / "d"
    assert main(["data", "arithmetic", "--out", str(out), "data.max_prompt_length=2", "data.shuffle=false"]) == 2
    assert capsys.readouterr().err == (
        "rlpost data: data.max_prompt_length=2, data.shuffle=false: arithmetic's rows do not read it (they read "
        "data.arithmetic_digits, data.val_size)\n"
    )
    assert not out.exists()
    assert main(["data", "arithmetic", "--out", str(out), "data.val_size=8"]) == 0
    assert len((out / "val.jsonl").read_text().splitlines()) == 8
