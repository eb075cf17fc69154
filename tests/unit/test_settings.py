"""The settings files: read over the defaults key by key, refused with the key at fault, defaults written once,
overrides, and engine kinds under their old names."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import settings.schema as settings_module
from serving.launcher.triton_command import Ports, server_command
from settings import ROOT, Settings, SettingsError, load_deployment, load_settings
from settings.deployment import python_stubs


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('task = "embedding"', 'task = "summarize"', "model.task"),
        ('kind = "auto"', 'kind = "tensorflow"', "engine.kind"),
        ("max_tokens = 0", "max_tokens = 16384", "max_tokens"),
        ("max_tokens = 0", "max_tokens = 1", "max_tokens"),
        ('pooling = "auto"', 'pooling = "weightedmean"', "model.pooling"),
        ('normalize = "auto"', 'normalize = "yes"', "model.normalize"),
        ("instances = 1", "instances = 0", "instances"),
        ("max_text_bytes = 1048576", "max_text_bytes = 0", "max_text_bytes"),
        ("max_text_bytes = 1048576", "max_text_bytes = 1.0e6", "max_text_bytes"),
        ("max_request_bytes = 8388608", "max_request_bytes = 1000", "at least tokenizer.max_text_bytes"),
        ("[encoder]", "[encoder]\nmax_text_bytes = 1", "unknown keys"),
        ("[server]", "[server]\ncolour = 1", "unknown keys"),
        ('precision = "auto"', 'precision = "fp16"', "runs on the CPU: fp32, bf16 GEMMs or auto"),
        ('topology = "auto"', 'topology = "three_stage"', "ensemble.topology"),
        ("options = {}", "options = {spin_us = [1]}", "plain values"),
    ],
)
def test_bad_settings_are_refused(tmp_path, old, new, message):
    path = tmp_path / "settings.toml"
    path.write_text(load_settings().path.read_text().replace(old, new, 1))
    with pytest.raises(SettingsError, match=message):
        load_settings(path)


def test_a_settings_file_states_only_what_differs_from_the_defaults(tmp_path):
    path = tmp_path / "variant.toml"
    path.write_text('[model]\nsource = "random-init:bert-base"\nname = "bert"\n\n[encoder]\ninstances = 3\n')
    variant, defaults = load_settings(path), load_settings()
    assert variant.encoder.instances == 3 and variant.model.name == "bert"
    assert variant.encoder.max_batch_size == defaults.encoder.max_batch_size, "a key left out keeps its default"
    assert variant.model.max_tokens == defaults.model.max_tokens and variant.server == defaults.server


@pytest.mark.parametrize("model", ['[model]\nsource = "random-init:bert-base"\n', "[encoder]\ninstances = 3\n"])
def test_a_settings_file_names_its_model(tmp_path, model):
    path = tmp_path / "variant.toml"
    path.write_text(model)
    with pytest.raises(SettingsError, match="must name source and name"):
        load_settings(path)


def test_defaults_are_written_once_in_the_defaults_file():
    sections = [field.type for field in dataclasses.fields(Settings) if field.name != "path"]
    with_defaults = [
        f"{section}.{field.name}"
        for section in sections
        for field in dataclasses.fields(getattr(settings_module, section))
        if field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
    ]
    assert not with_defaults, "defaults belong in settings/defaults.toml only"


@pytest.mark.parametrize("variant", sorted((ROOT / "settings" / "variants").glob("*.toml")), ids=str)
def test_complete_settings_read_back_as_themselves(tmp_path, variant):
    settings = load_settings(variant)
    complete = tmp_path / "complete.toml"
    complete.write_text(settings.as_toml())
    assert load_settings(complete).as_dict() == settings.as_dict()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (['engine.kind="torch"', 'engine.precision="fp16"'], "runs on the CPU: fp32, bf16 GEMMs or auto"),
        (
            ['engine.kind="tensorrt"', 'engine.precision="fp16"', "encoder.gpus=[0]", 'ensemble.topology="one_stage"'],
            '"two_stage"',
        ),
    ],
)
def test_engine_and_topology_must_agree(overrides, message):
    with pytest.raises(SettingsError, match=message):
        load_settings(None, overrides)


def test_auto_topology_follows_the_engine():
    assert load_settings(None, ['engine.kind="torch"']).topology == "one_stage", "torch on the CPU, fp32"
    tensorrt = ['engine.kind="tensorrt"', 'engine.precision="fp16"', "encoder.gpus=[0]"]
    buckets = ["tensorrt.sequence_buckets=[16, 256]", "model.max_tokens=256"]
    assert load_settings(None, [*tensorrt, *buckets]).topology == "two_stage"


@pytest.mark.parametrize(
    ("override", "check"),
    [
        ("encoder.instances=4", lambda s: s.encoder.instances == 4),
        ("engine.options.spin_us=0", lambda s: s.engine.options == {"spin_us": 0}),
        ('ensemble.topology="two_stage"', lambda s: s.topology == "two_stage"),
    ],
)
def test_overrides_change_one_value(override, check):
    settings = load_settings(None, [override])
    assert check(settings) and settings.digest() != load_settings().digest()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("encoder.instances", "section.key=value"),
        ("encoder.instances=four", "not TOML"),
        ("encoder.colour=1", "unknown"),
    ],
)
def test_bad_overrides_are_refused(override, message):
    with pytest.raises(SettingsError, match=message):
        load_settings(None, [override])


def test_the_torch_engines_old_name_is_read_with_a_warning(tmp_path):
    """engine.kind torch_gpu was renamed torch (it runs on the CPU too): for one release the old name still
    loads, as the new one, and says so."""
    path = tmp_path / "old.toml"
    path.write_text('[model]\nsource = "random-init:bert-tiny"\nname = "old"\n\n[engine]\nkind = "torch_gpu"\n')
    with pytest.warns(FutureWarning, match=r"engine.kind 'torch_gpu' is now 'torch'"):
        old = load_settings(path)
    assert old.engine.kind == "torch"
    with pytest.warns(FutureWarning):
        assert load_settings(None, ['engine.kind="torch_gpu"']).engine.kind == "torch"


def test_several_models_take_the_server_wide_sections_from_the_first_file(tmp_path):
    first, second = tmp_path / "first.toml", tmp_path / "second.toml"
    first.write_text('[model]\nsource = "random-init:bert-tiny"\nname = "a"\n\n[server]\ngrpc_port = 9001\n')
    second.write_text(
        '[model]\nsource = "random-init:bert-tiny"\nname = "b"\ntask = "rerank"\n\n[server]\ngrpc_port = 9001\n'
    )
    deployment = load_deployment([first, second])
    assert deployment.server.grpc_port == 9001 and [m.model.task for m in deployment.models] == ["embedding", "rerank"]
    second.write_text('[model]\nsource = "random-init:bert-tiny"\nname = "b"\n\n[api]\nworkers = 7\n')
    with pytest.raises(
        SettingsError, match=rf"{second} sets \[api\] workers = 7, .* first settings file, {first}, which has 0"
    ):
        load_deployment([first, second])


def test_several_models_are_served_under_their_names_and_one_as_ensemble(tmp_path):
    files = []
    for name in ("embedder", "reranker", "embedder"):
        files.append(tmp_path / f"{name}{len(files)}.toml")
        files[-1].write_text(f'[model]\nsource = "random-init:bert-tiny"\nname = "{name}"\n')
    with pytest.raises(SettingsError, match="'embedder' names more than one settings file's model"):
        load_deployment(files)
    deployment = load_deployment(files[:2])
    names = deployment.names(deployment.models[1])
    assert (names.model, names.tokenizer, names.encoder) == ("reranker", "reranker-tokenizer", "reranker-encoder")
    single = load_deployment(files[:1])
    assert single.names(single.first).model == "ensemble" and list(single.served()) == ["ensemble"]
    files[1].write_text('[model]\nsource = "random-init:bert-tiny"\nname = "two words"\n')
    with pytest.raises(SettingsError, match="'two words' cannot name a served model"):
        load_deployment(files[:2])


@pytest.mark.parametrize(
    ("variant", "stubs"),
    [
        ("defaults.toml", 1 + 1),  # one stage on the CPU: the ensemble's one instance and its query lane's
        ("variants/bert-base-h200.toml", 8 + 1),  # one stage, 8 instances on GPU 0 and the lane's 1; no stream
        ("variants/bert-base-h200-two-stage.toml", 8 + 4),  # tokenizer 8, encoder 4 on GPU 0; no lane
        ("variants/bert-base-h200x2.toml", (4 + 1) * 2),  # one stage on each GPU: [encoder]'s 4 and the lane's
        ("variants/tensorrt-h200.toml", 8),  # TensorRT serves the encoder: only the tokenizer is Python
    ],
)
def test_tritons_exit_timeout_allows_for_unloading_every_stub(variant, stubs):
    """Triton 2.51 unloads the Python stubs one after another (1.5 s each measured on an H200): its exit timeout
    is the drain's bound again plus server.unload_s_per_stub for each stub."""
    deployment = load_deployment([ROOT / "settings" / variant])
    assert python_stubs(deployment.first) == stubs
    assert deployment.triton_exit_timeout_s == 10 + 2 * stubs


def test_a_classifier_in_two_stages_unloads_its_postprocess_stubs_too():
    two_stage = load_settings(overrides=['ensemble.topology="two_stage"', 'model.task="classification"'])
    assert python_stubs(two_stage) == 3
    assert load_deployment([], ["server.unload_s_per_stub=0.5"]).triton_exit_timeout_s == 10 + 1


def test_warm_first_turns_on_tritons_rate_limiter_only_where_an_encoder_has_several_instances(tmp_path):
    """encoder.warm_first's instance priorities mean something only to Triton's rate limiter (--rate-limit), which
    the launcher (and the chart) turn on when any model asks for them; one instance, or warm_first = false, asks
    for nothing."""
    ports = Ports.free()

    def flags(*overrides: str) -> list[str]:
        deployment = load_deployment([], list(overrides))
        command = server_command(Path("tritonserver"), Path("r"), Path("b"), ports, "127.0.0.1", 10)
        limited = server_command(
            Path("tritonserver"), Path("r"), Path("b"), ports, "127.0.0.1", 10, rate_limited=deployment.rate_limited
        )
        return sorted(set(limited) - set(command))

    assert flags() == []  # the defaults: one instance
    assert flags("encoder.instances=4") == ["--rate-limit=execution_count"]
    assert flags("encoder.instances=4", "encoder.warm_first=false") == []
    assert not load_deployment([ROOT / "settings" / "variants" / "tensorrt-h200.toml"]).rate_limited  # 2, no groups
    first = tmp_path / "first.toml"
    first.write_text('[model]\nsource = "random-init:bert-tiny"\nname = "a"\n')
    second = tmp_path / "second.toml"
    second.write_text('[model]\nsource = "random-init:bert-tiny"\nname = "b"\n\n[encoder]\ninstances = 2\n')
    assert not load_deployment([first]).rate_limited and load_deployment([first, second]).rate_limited
