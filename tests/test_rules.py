"""The shipped rule files and site profiles load; files merge in order, and a broken one is named with its file and
line."""

from __future__ import annotations

from pathlib import Path

import pytest

from crawlergate.errors import ConfigError
from crawlergate.rules import CRAWLER_TAGS, default_rules_dir, load_rules, load_site_profiles, site_profiles_dir


def test_rules_shipped_files_load() -> None:
    ruleset = load_rules([default_rules_dir() / "heuristic.toml", default_rules_dir() / "crawlers.toml"])
    assert ruleset.rules
    assert {family.tag for family in ruleset.families} <= set(CRAWLER_TAGS)
    assert "cubot" in ruleset.human_tokens


def test_rules_heuristic_file_is_the_papers_heuristic() -> None:
    ruleset = load_rules([default_rules_dir() / "heuristic.toml"])
    tokens = {(rule.contains, rule.unless) for rule in ruleset.rules}
    assert tokens == {
        (("bot", "crawler"), ()),
        (("slurp",), ("firefox",)),
        (("mediapartners", "pubsub"), ()),
        (("http",), ("bsalsa", "browser")),
    }


def test_rules_merge_files_in_order(tmp_path: Path) -> None:
    extra = tmp_path / "extra.toml"
    extra.write_text('[[family]]\nname = "Ours"\ntag = "other"\ncontains = ["ourfetcher"]\n')
    ruleset = load_rules([default_rules_dir() / "heuristic.toml", extra])
    assert ruleset.rules[-1].family is not None and ruleset.rules[-1].family.name == "Ours"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param('[[crawler]]\ncontains = ["bot"\n', "not valid TOML", id="toml-syntax"),
        pytest.param('[[crawler]]\ncontains = "bot"\n', "must be a list of strings", id="not-a-list"),
        pytest.param('[[crawler]]\ncontains = [""]\n', "empty token", id="empty-token"),
        pytest.param('[[crawler]]\nunless = ["x"]\n', "at least one of", id="no-tokens"),
        pytest.param('[[crawler]]\ncontain = ["bot"]\n', "unknown key 'contain'", id="typo-key"),
        pytest.param('[[family]]\nname = "X"\ntag = "robots"\ncontains = ["x"]\n', "has tag 'robots'", id="bad-tag"),
        pytest.param('[[family]]\ntag = "seo"\ncontains = ["x"]\n', "needs name", id="no-name"),
        pytest.param('[[crawler]]\nnames = ["x"]\n', "belongs in a [[family]]", id="names-outside-family"),
        pytest.param("[robots]\nx = 1\n", "unknown table 'robots'", id="unknown-table"),
        pytest.param('[human]\ncontains = ["a"]\nextra = 1\n', "[human] takes contains", id="human-extra"),
        pytest.param("[human]\nfields = ['(unclosed']\n", "is no regular expression", id="human-bad-field"),
    ],
)
def test_rules_broken_file_names_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("# a comment\n" + text)
    with pytest.raises(ConfigError) as excinfo:
        load_rules([path])
    assert message in str(excinfo.value)
    assert str(path) in str(excinfo.value)


def test_rules_error_points_at_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text('# one\n# two\n[[family]]\nname = "Oops"\ntag = "robots"\ncontains = ["x"]\n')
    with pytest.raises(ConfigError, match=r"broken\.toml:4:"):
        load_rules([path])


def test_rules_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_rules([tmp_path / "nope.toml"])


def test_rules_every_shipped_site_profile_loads() -> None:
    names = sorted(path.stem for path in site_profiles_dir("").glob("*.toml"))
    assert names == ["demo-forum", "discourse", "django", "dokuwiki", "mediawiki", "phpbb", "trac", "wordpress"]
    for profile in load_site_profiles("", names):
        assert profile.title and profile.notes
        # A real application's profile says what it excludes and its sessions; the demo forum's, its writes.
        assert (profile.exclude and profile.session_cookies) or (profile.name == "demo-forum" and profile.writes)


def test_rules_unknown_site_profile_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="'drupal', which is no site profile. Known: demo-forum, discourse, django"):
        load_site_profiles("", ["drupal"])


def test_rules_broken_site_profile_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "sites").mkdir()
    (tmp_path / "sites" / "mine.toml").write_text('[site]\nname = "Mine"\n\n[cookies]\nsession = "sid"\n')
    with pytest.raises(ConfigError, match=r"mine.toml:5: 'session' must be a list"):
        load_site_profiles(str(tmp_path), ["mine"])


def test_rules_write_rules_are_checked_and_filled_safely(tmp_path: Path) -> None:
    from crawlergate.gate.writes import WriteRules
    from crawlergate.rules import load_site_profile

    profile = tmp_path / "site.toml"
    profile.write_text('[[write]]\npath = "/t/{id}/reply"\nmarks = ["/t/{id}", "/t/{id}?*", "/f?id={forum}&*", "/"]\n')
    rules = WriteRules(load_site_profile(profile).writes)
    assert rules.marks("POST", "/t/42/reply", b"forum=3") == (["/t/42", "/"], ["/t/42?*", "/f?id=3&*"])
    assert rules.marks("GET", "/t/42/reply", b"") == ([], []) and rules.marks("PUT", "/t/42/x", b"") == ([], [])
    # A visitor's value is percent-encoded: "*" cannot widen a pattern; a missing value skips its mark.
    assert rules.marks("POST", "/t/*/reply", b"") == (["/t/%2A", "/"], ["/t/%2A?*"])
    # ... but what a URL holds literally stays so, as the keys keep it: a wiki namespace, a subpage.
    assert rules.marks("POST", "/t/Talk:Foo/reply", b"forum=a/b")[1] == ["/t/Talk:Foo?*", "/f?id=a/b&*"]
    profile.write_text('[[write]]\npath = "/comment"\nfollow_location = true\nmarks = ["/"]\n')
    rules = WriteRules(load_site_profile(profile).writes)
    assert rules.marks("POST", "/comment", b"", location="/post/?unapproved=3") == (
        ["/post/?unapproved=3", "/post/", "/"],
        [],
    )
    for bad, message in (
        ('[[write]]\nmarks = ["/"]\n', "needs path"),
        ('[[write]]\npath = "/x"\nmethods = ["GET"]\nmarks = ["/"]\n', "methods must be among"),
        ('[[write]]\npath = "/x"\nmarks = ["x"]\n', "each starting with /"),
        ('[[write]]\npath = "/x"\nmarks = ["/t?title={title}*"]\n', "lets a visitor choose a prefix"),
    ):
        profile.write_text(bad)
        with pytest.raises(ConfigError, match=message):
            load_site_profile(profile)


def test_rules_discourse_posts_are_json_and_mark_their_topic() -> None:
    from crawlergate.gate.writes import WriteRules, form_fields

    rules = WriteRules(load_site_profiles("", ["discourse"])[0].writes)
    fields = form_fields(b'{"raw": "Thanks!", "topic_id": 42, "reply_to_post_number": null, "whisper": true}')
    assert fields == {"raw": "Thanks!", "topic_id": "42"}
    assert rules.marks("POST", "/posts", b"", fields) == (
        ["/t/42", "/"],
        ["/t/*/42", "/t/*/42?*", "/latest*"],
    )
    assert form_fields(b'{"topic_id": [1]}') == {} and form_fields(b"{broken") == {}
    assert form_fields(b"t=5&t=6") == {"t": "5"}
