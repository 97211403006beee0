"""JSON files plain or gzip-compressed by suffix: committed sweeps are
compressed, and jobs read, resume and report from either form."""

import gzip
import json

from specdec_jax.jobs.studies import report
from specdec_jax.runtime import jsonio


def test_round_trip_in_both_forms_and_compressed_bytes_are_stable(tmp_path):
    data = {"settings": {"a": 1}, "records": [], "text": "é"}
    for name in ("x.json", "x.json.gz"):
        jsonio.write_json(tmp_path / name, data)
        assert jsonio.read_json(tmp_path / name) == data
    with gzip.open(tmp_path / "x.json.gz", "rt") as f:  # really compressed
        assert json.load(f) == data
    first = (tmp_path / "x.json.gz").read_bytes()
    jsonio.write_json(tmp_path / "x.json.gz", data)
    assert (tmp_path / "x.json.gz").read_bytes() == first  # no timestamp inside
    assert not list(tmp_path.glob("*.tmp"))


def test_a_compressed_sweep_is_found_first_and_names_its_reports(tmp_path):
    assert jsonio.existing(tmp_path / "s.json") == tmp_path / "s.json"
    jsonio.write_json(tmp_path / "s.json.gz", {"records": []})
    assert jsonio.existing(tmp_path / "s.json") == tmp_path / "s.json.gz"
    assert jsonio.stem_of(tmp_path / "s.json.gz") == "s" == jsonio.stem_of("s.json")
    assert report.load_sweep(tmp_path / "s.json.gz") == ({}, [])
