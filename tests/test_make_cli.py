# SPDX-License-Identifier: Apache-2.0
"""``feedline make`` on the command line: in-process via feedline.cli.main and as a program."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from feedline.cli import main
from feedline_tools.generate import read_manifest


def test_make_writes_and_prints_a_summary(tmp_path, capsys):
    out = tmp_path / "bin"
    rc = main(
        [
            "make",
            "cifar10-bin",
            "--samples",
            "40",
            "--out",
            str(out),
            "--seed",
            "2",
            "--classes",
            "4",
            "--files",
            "2",
            "--no-progress",
        ]
    )
    assert rc == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("cifar10-bin: 40 samples of 3x32x32 uint8 (4 classes, class-sorted)")
    recs = np.fromfile(out / "data_batch_1.bin", dtype=np.uint8).reshape(-1, 3073)
    assert recs[:, 0].tolist() == [i * 4 // 40 for i in range(20)]
    man = read_manifest(out)
    assert man["options"]["classes"] == 4 and man["seed"] == 2 and not man["shuffle"]


def test_make_flags_reach_the_generator(tmp_path, capsys):
    out = tmp_path / "lmdb"
    assert (
        main(
            [
                "make",
                "cifar10-large",
                "-n",
                "30",
                "-o",
                str(out),
                "--shuffle",
                "--commit-every",
                "7",
                "--image-size",
                "8",
                "--encoded",
                "--no-progress",
            ]
        )
        == 0
    )
    man = read_manifest(out)
    assert man["shuffle"] and man["options"]["encoded"] is True
    assert man["provenance"]["commits"] == 5 and man["sample_shape"] == [3, 8, 8]
    assert "shuffled" in capsys.readouterr().out


def test_make_refuses_non_empty_output(tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "x").write_text("x")
    assert main(["make", "npy", "-n", "5", "-o", str(out)]) == 1
    assert "--force" in capsys.readouterr().err
    assert main(["make", "npy", "-n", "5", "-o", str(out), "--force", "--no-progress"]) == 0
    assert np.load(out / "data.npy").shape == (5, 3, 32, 32)


@pytest.mark.parametrize("argv", [["make", "--help"], ["make", "imagenet", "--help"]])
def test_help_has_examples(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text and "feedline make cifar10-large --samples" in text


def test_make_without_generator_prints_help(capsys):
    assert main(["make"]) == 2
    assert "cifar10-large" in capsys.readouterr().out


def test_make_runs_as_a_program(tmp_path):
    out = tmp_path / "tf"
    env = dict(os.environ, FEEDLINE_PROGRESS="2")  # bars on a pipe too
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "feedline",
            "make",
            "tfrecord",
            "-n",
            "12",
            "-o",
            str(out),
            "--payload",
            "example",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "tfrecord: 12 samples" in r.stdout
    assert "make tfrecord" in r.stderr  # the progress bar went to stderr
    assert len([f for f in os.listdir(out) if f.endswith(".tfrecord")]) == 4


def test_unwritable_output_is_an_error_not_a_crash(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["make", "npy", "-n", "5", "-o", str(blocker / "sub"), "--no-progress"]) == 1
    assert "cannot write" in capsys.readouterr().err
