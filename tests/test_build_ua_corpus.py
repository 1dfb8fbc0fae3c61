"""scripts/build_ua_corpus.py labels people from each source's own metadata and the user agent's grammar, never from
the classifier: what it leaves out, and why (issue 27)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "build_ua_corpus.py"


@pytest.fixture(scope="module")
def build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_ua_corpus", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("user_agent", "declared"),
    [
        pytest.param(
            "Mozilla/5.0 (iPhone; CPU iPhone OS 16_6_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
            "Version/16.6 Mobile/15E148 Safari/604.1 MicroAdBot/1.1 (https://www.microad.co.jp/contact/)",
            True,
            id="bot-name-after-safari",
        ),
        pytest.param(
            "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/538.1 (KHTML, like Gecko) Chromium/31.0.1650.63 "
            "Site-Shot/2.1 (http://www.site-shot.com/) Version/7.0 Safari/538.1",
            True,
            id="contact-address-in-parentheses",
        ),
        pytest.param(
            "Mozilla/5.0 (compatible;Impact Radius Compliance Bot) AppleWebKit/537.36 (KHTML, like Gecko) "
            "Chrome/81.0.4044.92 Safari/537.36",
            True,
            id="bot-in-compatible-comment",
        ),
        pytest.param("Mozilla/5.0 (compatible; AGU/0.8.4)", True, id="no-platform"),
        pytest.param(
            "Mozilla/5.0 (Linux; Android 9; CUBOT P30) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/87.0.4280.101 "
            "Mobile Safari/537.36",
            False,
            id="phone-brand-cubot",
        ),
        pytest.param(
            "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 "
            "Safari/537.36",
            False,
            id="chrome",
        ),
    ],
)
def test_build_leaves_out_tools_declaring_themselves_in_a_browser_string(
    build: ModuleType, user_agent: str, declared: bool
) -> None:
    assert bool(build.SELF_DECLARED.search(user_agent)) is declared


@pytest.mark.parametrize(
    ("user_agent", "service"),
    [
        pytest.param("Nokia SyncML HTTP Client", True, id="syncml-sync"),
        pytest.param("LGE SyncML DM Client/3.0", True, id="syncml-device-management"),
        pytest.param("HTC HTTP Service", True, id="phone-http-service"),
        pytest.param("Nokia3510i/1.0 (04.44) Profile/MIDP-1.0 Configuration/CLDC-1.0", False, id="feature-phone"),
    ],
)
def test_build_leaves_out_system_services(build: ModuleType, user_agent: str, service: bool) -> None:
    corpus = build.Corpus()
    corpus.person(user_agent, "mobile", "test", True)
    reasons = [reason for reason, _, _ in corpus.excluded.get(user_agent, [])]
    assert (reasons == ["a software updater or system service named in it"]) is service
    assert (user_agent in corpus.people) is not service


def test_build_leaves_out_podcast_catchers_without_a_browser(build: ModuleType, tmp_path: Path) -> None:
    lists = tmp_path / "usr" / "share" / "uap-core" / "test_resources"
    lists.mkdir(parents=True)
    (lists / "podcasting_user_agent_strings.yaml").write_text(
        "test_cases:\n"
        "  - user_agent_string: 'gPodder/3.7.0 (+http://gpodder.org/)'\n"
        "  - user_agent_string: 'Mozilla/5.0 (Linux; U; en-us; BeyondPod 4)'\n"
    )
    regexes = tmp_path / "regexes.yaml"
    regexes.write_text("user_agent_parsers: []\ndevice_parsers: []\n")
    corpus = build.Corpus()
    build.add_uap(corpus, tmp_path, build.UapParser([regexes]), build.ProjectFamilies(build.CRAWLERS_TOML))
    assert [reason for reason, _, _ in corpus.excluded["gPodder/3.7.0 (+http://gpodder.org/)"]] == [
        build.PODCAST_CATCHER
    ]
    assert list(corpus.people) == ["Mozilla/5.0 (Linux; U; en-us; BeyondPod 4)"]


@pytest.mark.parametrize(
    ("user_agent", "forged"),
    [
        pytest.param(
            "Mozilla/5.0 (Linux; Android 5.0; SM-G900P Build/LRX21T) AppleWebKit/537.36 (KHTML, like Gecko) "
            "Chrome/52.0.7704.1207 Mobile Safari/537.36",
            True,
            id="made-up-build-and-patch",
        ),
        pytest.param("Mozilla/5.0 (X11; Linux x86_64) Chrome/120.0.0.0 Safari/537.36", False, id="reduced-version"),
        pytest.param("Mozilla/5.0 (X11; Linux x86_64) Chrome/116.0.5845.96 Safari/537.36", False, id="real-version"),
    ],
)
def test_build_leaves_out_made_up_chrome_versions(build: ModuleType, user_agent: str, forged: bool) -> None:
    assert build.forged_chrome(user_agent) is forged
