"""A run folder remembers its settings and data: reruns that disagree get one clear error, nothing lost."""

import json

import pytest
from typer.testing import CliRunner

from recserve.cli.main import app
from recserve.constants import RUN_FILE, WEIGHTS_FILE
from recserve.errors import ConfigError
from recserve.train.run_writer import trained_epochs
from recserve.train.trainer import TrainConfig, train

SMALL = {"window": 8, "hidden": 16, "layers": 1, "heads": 2}
runner = CliRunner()


@pytest.fixture(scope="module")
def two_epoch_run(string_data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("reuse") / "run"
    train(string_data_dir, out, SMALL, TrainConfig(epochs=2, samples_per_user=1, device="cpu"), model="bert4rec")
    return out


def test_the_run_records_its_settings_and_data(two_epoch_run):
    recorded = json.loads((two_epoch_run / RUN_FILE).read_text())
    assert recorded["model"] == "bert4rec" and recorded["model_config"]["hidden"] == 16
    assert recorded["train"]["batch_size"] == 128 and "epochs" not in recorded["train"]
    assert recorded["data"]["users"] == 60 and len(recorded["data"]["digest"]) == 32
    assert trained_epochs(two_epoch_run) == 2


def test_the_run_names_its_data_folder_and_the_later_stages_find_it_there(two_epoch_run, string_data_dir, tmp_path):
    """run.json names the data folder (what the exporter's quality check and `recserve bench` read); the
    same data moved elsewhere is still the same run."""
    import shutil

    from recserve.artifacts.run_record import data_folder_of

    assert not (two_epoch_run / "metrics.json").exists()  # train() writes none: the record alone says it
    assert data_folder_of(two_epoch_run) == string_data_dir.resolve()
    moved = tmp_path / "moved"
    shutil.copytree(string_data_dir, moved)
    run = tmp_path / "run"
    shutil.copytree(two_epoch_run, run)
    train(moved, run, SMALL, TrainConfig(epochs=3, samples_per_user=1, device="cpu"), model="bert4rec")  # resumed
    assert data_folder_of(run) == moved.resolve()
    # the copied folder's checkpoints were overwritten, not versioned beside (a next resume reads the newest)
    assert trained_epochs(run) == 3 and not list((run / "checkpoints").glob("*-v*.ckpt"))


def test_other_model_settings_are_refused_naming_what_differs(two_epoch_run, string_data_dir):
    before = (two_epoch_run / WEIGHTS_FILE).read_bytes()
    with pytest.raises(ConfigError, match=r"model_config.hidden: 16 in the run, 32 now.*--overwrite"):
        train(
            string_data_dir,
            two_epoch_run,
            SMALL | {"hidden": 32},
            TrainConfig(epochs=3, samples_per_user=1, device="cpu"),
            model="bert4rec",
        )
    assert (two_epoch_run / WEIGHTS_FILE).read_bytes() == before  # nothing was touched


def test_a_run_recorded_before_a_setting_existed_resumes_with_it_off(two_epoch_run, string_data_dir, tmp_path):
    """run.json of an older recserve lacks the settings added since: with each off (false, 0) the run is the one
    recorded and resumes; on, it is another run, refused naming the setting."""
    import shutil

    run = tmp_path / "older"
    shutil.copytree(two_epoch_run, run)
    recorded = json.loads((run / RUN_FILE).read_text())
    del recorded["train"]["label_smoothing"]  # a setting with an off value, as a newer option would be
    (run / RUN_FILE).write_text(json.dumps(recorded))
    train(string_data_dir, run, SMALL, TrainConfig(epochs=3, samples_per_user=1, device="cpu"), model="bert4rec")
    assert trained_epochs(run) == 3
    (run / RUN_FILE).write_text(json.dumps(recorded))
    smoothed = TrainConfig(epochs=4, samples_per_user=1, device="cpu", label_smoothing=0.1)
    with pytest.raises(ConfigError, match=r"train.label_smoothing: None in the run, 0.1 now"):
        train(string_data_dir, run, SMALL, smoothed, model="bert4rec")


def test_other_data_is_refused(two_epoch_run, ml100k_dir):
    with pytest.raises(ConfigError, match=r"data.items: 30 in the run, 1682 now"):
        train(
            ml100k_dir, two_epoch_run, SMALL, TrainConfig(epochs=3, samples_per_user=1, device="cpu"), model="bert4rec"
        )


def test_fewer_epochs_than_trained_says_so(two_epoch_run, string_data_dir):
    with pytest.raises(ConfigError, match="has trained 2 epochs and --epochs 1 asks for fewer; ask for more than 2"):
        train(
            string_data_dir,
            two_epoch_run,
            SMALL,
            TrainConfig(epochs=1, samples_per_user=1, device="cpu"),
            model="bert4rec",
        )


def test_more_epochs_resume_the_same_run(string_data_dir, tmp_path):
    """The second call trains one more epoch from the first call's last checkpoint, not two from scratch."""
    import lightning as L

    class Epochs(L.Callback):
        def __init__(self):
            self.started = []

        def on_train_epoch_start(self, trainer, module):
            self.started.append(trainer.current_epoch)

    cfg = TrainConfig(epochs=1, samples_per_user=1, device="cpu")
    first, second = Epochs(), Epochs()
    train(string_data_dir, tmp_path / "run", SMALL, cfg, callbacks=[first])
    train(
        string_data_dir,
        tmp_path / "run",
        SMALL,
        TrainConfig(epochs=2, samples_per_user=1, device="cpu"),
        callbacks=[second],
    )
    assert first.started == [0] and second.started == [1]
    assert trained_epochs(tmp_path / "run") == 2


def test_overwrite_starts_afresh_and_records_the_new_settings(string_data_dir, tmp_path):
    train(
        string_data_dir,
        tmp_path / "run",
        SMALL,
        TrainConfig(epochs=2, samples_per_user=1, device="cpu"),
        model="bert4rec",
    )
    train(
        string_data_dir,
        tmp_path / "run",
        SMALL | {"hidden": 32},
        TrainConfig(epochs=1, samples_per_user=1, device="cpu"),
        overwrite=True,
    )
    assert json.loads((tmp_path / "run" / RUN_FILE).read_text())["model_config"]["hidden"] == 32
    assert trained_epochs(tmp_path / "run") == 1


def test_a_folder_holding_other_files_is_never_deleted(string_data_dir, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds files but no recserve run"):
        train(string_data_dir, tmp_path, SMALL, TrainConfig(epochs=1, samples_per_user=1, device="cpu"), overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_run_without_its_record_is_refused(two_epoch_run, string_data_dir, tmp_path):
    import shutil

    shutil.copytree(two_epoch_run, tmp_path / "old")
    (tmp_path / "old" / RUN_FILE).unlink()
    with pytest.raises(ConfigError, match=f"without {RUN_FILE}"):
        train(
            string_data_dir,
            tmp_path / "old",
            SMALL,
            TrainConfig(epochs=3, samples_per_user=1, device="cpu"),
            model="bert4rec",
        )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hidden", "32"], "model_config.hidden: 16 in the run, 32 now"),
        (["--hidden", "16", "--epochs", "1"], "has trained 2 epochs"),
        (["--hidden", "16", "--loss", "softmax"], "loss='softmax': expected one of auto, full"),
    ],
)
def test_the_cli_prints_one_line_and_no_traceback(two_epoch_run, string_data_dir, args, message):
    result = runner.invoke(
        app,
        [
            "train",
            "--model",
            "bert4rec",  # the run's model (the command's default is SASRec)
            "--data",
            str(string_data_dir),
            "--out",
            str(two_epoch_run),
            "--window",
            "8",
            "--samples-per-user",
            "1",
            "--device",
            "cpu",
            *args,
        ],
    )
    assert result.exit_code == 1
    assert message in " ".join(result.output.split()) and "Traceback" not in result.output


@pytest.mark.parametrize("damage", ["truncated", "garbage", "other weights"])
def test_a_tampered_weights_file_gets_one_line_naming_it_never_a_traceback(tiny_run, ml100k_dir, tmp_path, damage):
    """Once a tampered checkpoint gave torch's traceback: every reader names the file and what to do."""
    import shutil

    import torch

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    weights = run / "model.pt"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:1000])
    elif damage == "garbage":
        weights.write_bytes(b"\x80\x04not a pickle of tensors at all" * 50)
    else:
        torch.save({"item_emb.weight": torch.zeros(3, 3)}, weights)
    result = runner.invoke(app, ["evaluate", "--run", str(run), "--data", str(ml100k_dir)])
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    assert f"{weights}:" in said and "train the run again" in said, said


def test_a_rerun_may_switch_the_refit_and_the_run_follows(string_data_dir, tmp_path):
    """The refit is a step after training (the sequence models' default, resumable): a run rerun with it refits, and a
    refit run rerun without it keeps the validated weights as model.pt, the file beside them and the refit's
    records in metrics.json gone (a stale file would be ranked as the validated side of a refit no longer
    there)."""
    import torch

    from recserve.constants import METRICS_FILE, VALIDATED_WEIGHTS_FILE

    run = tmp_path / "run"
    args = ["train", "--data", str(string_data_dir), "--out", str(run), "--model", "bert4rec", "--epochs", "2"]
    args += ["--samples-per-user", "1", "--device", "cpu"] + [f"--{k}={v}" for k, v in SMALL.items()]

    def trained(*switch: str) -> dict:
        result = runner.invoke(app, args + list(switch))
        assert result.exit_code == 0, result.output
        return json.loads((run / METRICS_FILE).read_text())

    metrics = trained("--refit")
    assert metrics["refit"]["epochs"] >= 1 and "test_validated" in metrics
    assert (run / VALIDATED_WEIGHTS_FILE).is_file()
    metrics = trained("--no-refit")
    assert "refit" not in metrics and "test_validated" not in metrics
    assert not (run / VALIDATED_WEIGHTS_FILE).exists()
    best = torch.load(run / "checkpoints" / "best.ckpt", weights_only=True)["state_dict"]
    kept = torch.load(run / WEIGHTS_FILE, weights_only=True)
    assert all(torch.equal(kept[name], best[f"model.{name}"]) for name in kept)
    metrics = trained("--refit")  # and on again
    assert "refit" in metrics and "test_validated" in metrics and (run / VALIDATED_WEIGHTS_FILE).is_file()
    recorded = json.loads((run / RUN_FILE).read_text())
    assert "refit" not in recorded["train"]
    recorded["train"]["refit"] = False  # as a recserve recorded it before the refit was resumable
    (run / RUN_FILE).write_text(json.dumps(recorded))
    assert "refit" in trained("--refit")  # the run resumes, refitted
