"""`RowFile`, the metrics' and samples' log: a file deleted under the run is written again."""

import json

from rlpost.metrics.summary import read_metrics
from rlpost.metrics.trackers import JsonlTracker


def test_a_metrics_file_deleted_while_the_run_writes_is_written_again_with_every_row(tmp_path, capsys):
    """The fourteenth catalogue's t27: `rm metrics.jsonl` mid-run sent every later row into the
    unlinked file, and the summary said no step ran. The next row finds it gone, writes the rows
    the run still holds back at the path, then its own; a file deleted with its folder is left
    to the run's folder check."""
    tracker = JsonlTracker(tmp_path)
    for step in (1, 2, 3):
        tracker.log({"reward/mean": step / 10}, step)
    (tmp_path / "metrics.jsonl").unlink()
    tracker.log({"reward/mean": 0.4}, 4)
    tracker.log({"reward/mean": 0.5}, 5)
    tracker.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5]
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[3])["reward/mean"] == 0.4
    assert (
        capsys.readouterr().err
        == f"rlpost: {tmp_path / 'metrics.jsonl'} was deleted during the run: written again (3 rows)\n"
    )
