from __future__ import annotations

from pathlib import Path

import pytest

from crawlergate.classify import Classifier
from crawlergate.config import ClassifySettings, L2Settings, Settings

DATA = Path(__file__).parent / "data"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Default settings with the L2 cache under the test's own temporary directory."""
    return Settings(l2=L2Settings(cache_dir=str(tmp_path / "cache")))


@pytest.fixture(scope="session")
def classifier() -> Classifier:
    return Classifier.from_settings(ClassifySettings())


@pytest.fixture(scope="session")
def paper_classifier() -> Classifier:
    """The paper's Heuristic 1 alone."""
    return Classifier.from_settings(ClassifySettings(rule_files=("heuristic.toml",)))


def read_user_agents(name: str) -> list[str]:
    lines = (DATA / "user_agents" / name).read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line and not line.startswith("#")]
