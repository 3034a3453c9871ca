"""``refusion serve --ray --replicas 2``: two Ray Serve replicas behind one entry point answer the official openai
client as offline decoding does; the Ray flags are checked before anything starts; without Ray, one line says what to
install."""

import os
import signal
import sys
import threading

import httpx
import openai
import pytest

import refusion
from refusion.api import load_model
from refusion.cli import main
from refusion.errors import ConfigError
from refusion.serve import ray_app
from tests.support.serving import free_port, metric, one_torch_thread  # noqa: F401 (a fixture)

MODEL = "refusion-default"
# (openai's keyword arguments, the keywords of refusion.generate that decode the same tokens)
CASES = [
    ({}, {}),
    (
        {"temperature": 0.9, "top_p": 0.95, "seed": 7, "max_tokens": 16},
        {"temperature": 0.9, "top_p": 0.95, "seed": 7, "gen_length": 16},
    ),
]
PROMPTS = ["rev hello=", "copy abc=", "add 12+34="]


@pytest.fixture(scope="module")
def ray_server():
    """``deploy(replicas=2)`` (what ``refusion serve --ray --replicas 2`` runs) on a local Ray of 2 CPUs."""
    pytest.importorskip("ray.serve")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    server = None
    try:
        server = ray_app.deploy(replicas=2, host="127.0.0.1", port=free_port(), torch_threads=1, log_level="warning")
        yield server
    finally:
        if server is not None:
            server.stop()
        ray.shutdown()


@pytest.fixture(scope="module")
def model():
    return load_model()


def offline(model, prompt, options):
    length = options.get("gen_length", 32)
    tokens = refusion.generate(prompt, model, **options).tokens.tolist()[:length]
    return tokens, model.tokenizer.decode(tokens, skip_special_tokens=True)


def run_cli(capsys, *argv):
    status = main(["serve", *argv])
    return status, capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--replicas", "2"], "`--replicas` needs `--ray`"),
        (["--max-replicas", "3"], "`--max-replicas` needs `--ray`"),
        (["--ray", "--replicas", "2", "--max-replicas", "3"], "exclude each other"),
        (["--ray", "--min-replicas", "2"], "`--min-replicas` needs `--max-replicas`"),
        (["--ray", "--replicas", "0"], "`--replicas` must be an integer >= 1"),
        (["--ray", "--min-replicas", "3", "--max-replicas", "2"], "`--max-replicas` must be an integer >= 3"),
        (["--ray", "--cpus-per-replica", "-1"], "`--cpus-per-replica` must be a finite number >= 0"),
        (["--ray", "--port", "0"], "`--port` must be an integer in [1, 65535]"),
    ],
)
def test_ray_flags_are_checked_before_anything_starts(capsys, monkeypatch, argv, flag):
    monkeypatch.setattr(ray_app, "serve_on_ray", lambda *a, **k: pytest.fail("started despite a bad flag"))
    status, err = run_cli(capsys, *argv)
    assert status == 2 and err.count("\n") == 1 and err.startswith("refusion: error: ") and flag in err, err


def test_the_command_hands_deploy_the_flags(capsys, monkeypatch):
    import pickle

    seen = {}
    monkeypatch.setattr(ray_app, "serve_on_ray", lambda model, **options: seen.update(options, model=model))
    assert (
        run_cli(
            capsys,
            "--ray",
            "--replicas",
            "2",
            "--port",
            "8123",
            "--threads",
            "1",
            "--max-rows",
            "4",
            "--allow-imports",
            "--selector",
            "topk",
            "-p",
            "k=2",
            "--served-model-name",
            "m",
        )[0]
        == 0
    )
    assert seen["address"] == "local" and seen["replicas"] == 2 and seen["port"] == 8123 and seen["max_rows"] == 4
    assert seen["torch_threads"] == 1 and seen["policy"].allow_imports and seen["model_name"] == "m"
    assert seen["defaults"].parts == {"selector": "topk"} and seen["defaults"].params == {"k": 2}
    assert seen["cpus_per_replica"] == 1 and seen["gpus_per_replica"] == 0
    assert pickle.loads(pickle.dumps(seen["loader"])).func is seen["loader"].func  # it travels to the replicas
    assert run_cli(capsys, "--ray", "10.0.0.1:6379", "--min-replicas", "0", "--max-replicas", "3")[0] == 0
    assert seen["address"] == "10.0.0.1:6379" and seen["replicas"] == (0, 3)


def test_without_ray_one_line_says_what_to_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConfigError, match=r'pip install "refusion\[ray\]"'):
        ray_app.import_serve()
    status, err = run_cli(capsys, "--ray", "--replicas", "2", "--port", str(free_port()))
    assert status == 2 and err.count("\n") == 1 and 'pip install "refusion[ray]"' in err, err


def test_sigterm_stops_ray_serve_and_ray(monkeypatch):
    """``serve_on_ray`` serves until SIGTERM, then stops the deployment, and puts the signal handlers back (the real
    thing, Ray and all, takes half a minute more: the live test above covers ``deploy`` and ``stop``)."""

    class Deployed:
        url, stopped = "http://127.0.0.1:1", 0

        def replicas(self):
            return {"RUNNING": 2}

        def stop(self):
            self.stopped += 1

    deployed = Deployed()
    monkeypatch.setattr(ray_app, "deploy", lambda model, on_connect, **options: on_connect() or deployed)
    before = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    ray_app.serve_on_ray(None, log_level="warning")
    timer.join()
    assert deployed.stopped == 1 and signal.getsignal(signal.SIGTERM) is before


def test_sigterm_while_deploying_interrupts_it(monkeypatch):
    """A signal while the replicas start raises KeyboardInterrupt out of ``deploy`` (which stops what it started)."""

    def deploy(model, on_connect, **options):
        on_connect()
        os.kill(os.getpid(), signal.SIGTERM)
        threading.Event().wait(5)
        pytest.fail("the signal did not interrupt the deployment")

    monkeypatch.setattr(ray_app, "deploy", deploy)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        ray_app.serve_on_ray(None)
    assert signal.getsignal(signal.SIGTERM) is before


def test_an_address_nothing_answers_on_is_one_line(capsys):
    pytest.importorskip("ray.serve")
    status, err = run_cli(capsys, "--ray", f"127.0.0.1:{free_port()}", "--replicas", "2")
    assert status == 2 and err.count("\n") == 1 and "Cannot connect to Ray at '127.0.0.1:" in err, err


def test_the_deployment_holds_a_full_batch_and_queue_per_replica():
    pytest.importorskip("ray.serve")
    fixed = ray_app.deployment(
        replicas=2,
        max_rows=4,
        max_queue=8,
        shutdown_timeout=1.5,
        log_level="trace",
        cpus_per_replica=1,
        gpus_per_replica=0.5,
    )
    assert fixed.num_replicas == 2 and fixed.max_ongoing_requests == 12
    assert fixed.ray_actor_options == {"num_cpus": 1, "num_gpus": 0.5}
    scaled = ray_app.deployment(
        replicas=(0, 3),
        max_rows=16,
        max_queue=None,
        shutdown_timeout=30.0,
        log_level="info",
        cpus_per_replica=1,
        gpus_per_replica=0,
    )  # Ray checks the bounds
    assert scaled.max_ongoing_requests == 16 + ray_app.UNBOUNDED_QUEUE


# last in the module: the Ray the fixture starts stays up until the module ends
@pytest.mark.usefixtures("one_torch_thread")
def test_two_replicas_answer_the_openai_client_as_offline_decoding(ray_server, model):
    from ray import serve

    assert ray_server.replicas() == {"RUNNING": 2}
    deployment = serve.status().applications[ray_app.APP_NAME].deployments[ray_app.APP_NAME]
    assert sum(deployment.replica_states.values()) == 2
    client = openai.OpenAI(base_url=ray_server.url + "/v1", api_key="x", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == [MODEL]
    for kwargs, options in CASES:
        for prompt in PROMPTS:
            tokens, text = offline(model, prompt, options)
            whole = client.completions.create(model=MODEL, prompt=prompt, **kwargs)
            assert whole.choices[0].text == text and whole.refusion["tokens"] == tokens
            chunks = list(client.completions.create(model=MODEL, prompt=prompt, stream=True, **kwargs))
            assert "".join(c.choices[0].text for c in chunks) == text
            assert chunks[-1].refusion["tokens"] == tokens and chunks[-1].choices[0].finish_reason is not None
    scraped = httpx.get(ray_server.url + "/metrics", timeout=10)  # one replica's registry, as Ray Serve routes it
    assert scraped.status_code == 200 and metric(scraped.text, "refusion_forwards_total") > 0
    assert httpx.get(ray_server.url + "/health", timeout=10).json()["status"] == "ok"
