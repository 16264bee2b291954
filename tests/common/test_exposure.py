"""Engine and gateway refuse a non-loopback --host without an API key (docs/security.md), as the
collector does: one line on stderr, exit code 2, before any model loads; `--insecure-public` allows
it with one warning."""

from __future__ import annotations

import argparse
import subprocess
import time

import pytest

from specwatch.common.cli import add_exposure_arguments, check_exposure, is_loopback
from specwatch.common.errors import UsageError
from specwatch.common.procs import child_env, specwatch_command


def options(*argv: str, env_key: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_exposure_arguments(parser)
    args = parser.parse_args(argv)
    if env_key is not None and args.api_key is None:
        args.api_key = env_key
    return args


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.0.1", "::1", "localhost"])
def test_loopback_needs_no_key(host, capsys):
    check_exposure("engine", options("--host", host))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "engine.example"])
def test_a_public_host_without_a_key_is_refused(host):
    with pytest.raises(UsageError, match=f"refusing to listen on {host} with no API key.*--insecure-public"):
        check_exposure("gateway", options("--host", host))
    assert not is_loopback(host)


def test_a_key_or_insecure_public_allows_a_public_host(capsys):
    check_exposure("engine", options("--host", "0.0.0.0", "--api-key", "k"))
    assert capsys.readouterr().err == ""
    check_exposure("engine", options("--host", "0.0.0.0", "--insecure-public"))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "warning: the engine listens on 0.0.0.0 with no API key" in err


def test_a_key_list_that_names_no_key_is_refused():
    with pytest.raises(UsageError, match="names no key"):
        check_exposure("engine", options("--host", "127.0.0.1", "--api-key", " , "))


@pytest.mark.parametrize(
    "argv",
    [
        ("engine", "serve", "--host", "0.0.0.0"),
        ("gateway", "serve", "--host", "0.0.0.0", "--upstream", "a=http://127.0.0.1:9"),
    ],
)
def test_the_cli_refuses_in_one_line_with_exit_2_before_loading(argv):
    env = child_env()
    env.pop("SPECWATCH_API_KEY", None)
    started = time.monotonic()
    done = subprocess.run(specwatch_command(*argv), env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "refusing to listen on 0.0.0.0 with no API key" in lines[0]
    assert "loading" not in done.stderr.lower() and time.monotonic() - started < 60  # no model was loaded
