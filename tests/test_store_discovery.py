"""The app's store discovery lists partitioned Parquet exports next to DuckDB files."""
from storage import queries
from storage.export import export_partitioned
from storage.recorder import Recorder


def test_a_partitioned_export_directory_is_discovered_and_opens_read_only(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    src = runs / "store.duckdb"
    rec = Recorder(src)
    run_id = rec.start_run({"env": "bandit", "model": "tiny", "algo": "grpo"}, name="r")
    rec.record_step(1, metrics={"reward/mean": 0.5})
    rec.finish("finished")
    export_partitioned(src, runs / "exported")
    (runs / "plain_dir").mkdir()                      # a directory without the marker
    (runs / "plain_dir" / "x.parquet").write_bytes(b"")

    found = queries.discover_stores(("runs",), root=tmp_path)
    assert found == [str(runs / "exported"), str(src)]
    table = queries.all_runs(found)
    assert table.groupby("store")["run_id"].apply(list).to_dict() == {
        str(runs / "exported"): [run_id], str(src): [run_id]}
    assert queries.metrics(runs / "exported", run_id)["value"].tolist() == [0.5]
