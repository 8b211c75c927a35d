"""Install hints follow how attention-zoo was installed (pip's direct_url.json)."""

from __future__ import annotations

import json
import sys
from importlib.metadata import PackageNotFoundError

import pytest

import attention_zoo
from attention_zoo import install
from attention_zoo.cli import main as zoo_main
from attention_zoo.store import ResultStore


class FakeDistribution:
    def __init__(self, direct_url: dict | None) -> None:
        self.direct_url = direct_url

    def read_text(self, name: str) -> str | None:
        assert name == "direct_url.json"
        return None if self.direct_url is None else json.dumps(self.direct_url)


EDITABLE = {"url": "file:///src/attention-zoo", "dir_info": {"editable": True}}
WHEEL = {"url": "file:///tmp/attention_zoo-0.1.0-py3-none-any.whl", "archive_info": {}}


@pytest.mark.parametrize(
    ("direct_url", "hint"),
    [
        (EDITABLE, "pip install -e '.[report]'"),
        (WHEEL, "pip install 'attention-zoo[report]'"),
        (None, "pip install 'attention-zoo[report]'"),  # from an index: no direct URL
    ],
)
def test_report_hint_fits_the_installation(
    tmp_path, monkeypatch, capsys, direct_url: dict | None, hint: str
) -> None:
    monkeypatch.setattr(install, "distribution", lambda name: FakeDistribution(direct_url))
    monkeypatch.setattr(install, "in_checkout", lambda: False)  # as if installed
    path = tmp_path / "s.sqlite"
    ResultStore(path).close()
    monkeypatch.setitem(sys.modules, "seaborn", None)  # import raises ImportError
    assert zoo_main(["report", "--store", str(path), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"(seaborn is missing): {hint}") and "\n" not in err


def test_code_run_from_a_checkout_gets_the_editable_hint(monkeypatch) -> None:
    def not_installed(name: str):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(install, "distribution", not_installed)
    monkeypatch.setattr(install, "in_checkout", lambda: False)
    assert install.install_hint("ray") == "pip install -e '.[ray]'"


def test_result_store_is_importable_from_the_package() -> None:
    assert attention_zoo.ResultStore is ResultStore and "ResultStore" in attention_zoo.__all__


def test_a_checkout_gets_the_editable_hint_whatever_metadata_is_on_the_path(monkeypatch) -> None:
    monkeypatch.setattr(install, "distribution", lambda name: FakeDistribution(None))
    assert install.in_checkout()  # the tests run from the checkout
    assert install.install_hint("report") == "pip install -e '.[report]'"
