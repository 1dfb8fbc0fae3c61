"""PHP applications from Debian's packages, each set up in a temporary folder and served on loopback.

- MediaWiki 1.39 (``mediawiki``): ``maintenance/install.php`` with SQLite into the folder (the package's
  code stays in /usr/share/mediawiki; ``MW_CONFIG_FILE`` names the folder's LocalSettings.php), 120
  linked articles in 6 categories imported with ``importTextFiles.php``, ``$wgUseCdn`` on and the gate in
  ``$wgCdnServers`` so that an edit sends the gate ``PURGE`` requests.
- WordPress 6.1 (``wordpress``, ``wordpress-theme-twentytwentyone``): a ``mariadbd`` of its own
  (``mariadb-install-db`` into the folder, a Unix socket, no TCP), a copy of /usr/share/wordpress with a
  ``wp-config.php`` of its own (Debian's reads /etc/wordpress), installed by ``wp_install()`` from PHP's
  CLI, 110 posts with a comment each in 6 categories and 9 tags, pretty permalinks.
- DokuWiki (``dokuwiki``): a copy of /usr/share/dokuwiki whose configuration and pages live in the folder.

Each is served by PHP's built-in server (``php -S``, one process, with a router script for WordPress's
permalinks) or by php-fpm behind nginx (two processes, configs in the folder, a Unix socket between
them). Every process runs in its own process group (``Service``) and is killed on teardown. The site is
told its public URL (the gate's address, reserved before the site starts) as a deployment would be.
"""

from __future__ import annotations

import contextlib
import glob
import html as html_module
import os
import re
import shutil
import socket
import textwrap
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from tests.sites.processes import PortReservation, Service, free_port, run

MEDIAWIKI = Path("/usr/share/mediawiki")
WORDPRESS = Path("/usr/share/wordpress")
DOKUWIKI = Path("/usr/share/dokuwiki")
NGINX = Path("/usr/sbin/nginx")

USER = "Admin"
PASSWORD = "Gate-Test-Pass-2024"
WP_USER = "admin"

KINDS = ("mediawiki", "wordpress", "dokuwiki")
SERVERS = ("builtin", "fpm")
# The site profile (rules/sites/NAME.toml) each application is run with.
PROFILE = {"mediawiki": "mediawiki", "wordpress": "wordpress", "dokuwiki": "dokuwiki"}

INSTALL_HINT = "scripts/install-php-sites installs them (CI runs it)"


def _php() -> str | None:
    return shutil.which("php")


def _php_fpm() -> str | None:
    found = shutil.which("php-fpm") or next(iter(sorted(glob.glob("/usr/sbin/php-fpm*"), reverse=True)), None)
    return found


def missing(kind: str, server: str) -> str:
    """Why ``kind`` cannot be served by ``server`` here (Debian packages not installed), or ""."""
    needs: list[tuple[bool, str]] = [(_php() is not None, "php-cli")]
    if kind == "mediawiki":
        needs += [((MEDIAWIKI / "maintenance" / "install.php").is_file(), "mediawiki")]
        needs += [(_php_module("pdo_sqlite"), "php-sqlite3")]
    elif kind == "wordpress":
        needs += [((WORDPRESS / "wp-load.php").is_file(), "wordpress")]
        needs += [
            ((WORDPRESS / "wp-content" / "themes" / "twentytwentyone").is_dir(), "wordpress-theme-twentytwentyone")
        ]
        needs += [(shutil.which("mariadbd") is not None, "mariadb-server"), (_php_module("mysqli"), "php-mysql")]
    elif kind == "dokuwiki":
        needs += [((DOKUWIKI / "doku.php").is_file(), "dokuwiki")]
    if server == "fpm":
        needs += [(_php_fpm() is not None, "php-fpm"), (NGINX.exists(), "nginx")]
    absent = [package for present, package in needs if not present]
    if not absent:
        return ""
    return f"{kind} via {server}: Debian packages not installed: {', '.join(absent)} ({INSTALL_HINT})"


_MODULES: dict[str, bool] = {}


def _php_module(name: str) -> bool:
    if name not in _MODULES:
        php = _php()
        if php is None:
            _MODULES[name] = False
        else:
            import subprocess

            done = subprocess.run([php, "-m"], capture_output=True, text=True, timeout=30)
            _MODULES.update({line.strip().lower(): True for line in done.stdout.splitlines() if line.strip()})
            _MODULES.setdefault(name, False)
    return _MODULES[name]


def _running_as_root() -> bool:
    return os.geteuid() == 0


# --- the web servers ----------------------------------------------------------------------------------


def builtin_server(
    name: str, docroot: Path, port: int, folder: Path, *, router: Path | None = None, env: dict[str, str] | None = None
) -> Service:
    """PHP's built-in server: one process, HTTP/1.0-style answers (Connection: close)."""
    php = _php()
    assert php is not None
    argv = [php, "-d", "display_errors=stderr", "-d", "log_errors=On", "-S", f"127.0.0.1:{port}", "-t", str(docroot)]
    if router is not None:
        argv.append(str(router))
    return Service(name, argv, port=port, log_dir=folder, env=env, probe=_answers)


def _answers(client: httpx.Client) -> bool:
    return client.get("/").status_code < 500


def fpm_and_nginx(
    name: str, docroot: Path, port: int, folder: Path, *, env: dict[str, str] | None = None
) -> list[Service]:
    """php-fpm (a pool of 2 on a Unix socket in ``folder``) and nginx on ``port`` in front of it."""
    fpm = _php_fpm()
    assert fpm is not None
    folder.mkdir(parents=True, exist_ok=True)
    sock = folder / "php-fpm.sock"
    as_root = _running_as_root()
    pool_env = "\n".join(f"env[{key}] = {value}" for key, value in (env or {}).items())
    fpm_conf = folder / "php-fpm.conf"
    fpm_conf.write_text(
        textwrap.dedent(
            f"""\
            [global]
            pid = {folder}/php-fpm.pid
            error_log = {folder}/php-fpm-error.log
            daemonize = no

            [site]
            listen = {sock}
            pm = static
            pm.max_children = 2
            catch_workers_output = yes
            php_admin_value[error_log] = {folder}/php-error.log
            php_admin_flag[log_errors] = on
            """
        )
        + ("user = root\ngroup = root\n" if as_root else "")
        + pool_env
        + "\n",
        encoding="utf-8",
    )
    argv = [fpm, "--nodaemonize", "--fpm-config", str(fpm_conf)]
    if as_root:
        argv.append("--allow-to-run-as-root")
    fpm_service = Service(f"{name}-php-fpm", argv, port=port, log_dir=folder, probe=lambda _client: _unix_socket(sock))

    temp = folder / "nginx-temp"
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (temp / sub).mkdir(parents=True, exist_ok=True)
    nginx_conf = folder / "nginx.conf"
    nginx_conf.write_text(
        textwrap.dedent(
            f"""\
            {"user root;" if as_root else ""}
            worker_processes 1;
            daemon off;
            pid {folder}/nginx.pid;
            error_log {folder}/nginx-error.log;
            events {{ worker_connections 256; }}
            http {{
                include /etc/nginx/mime.types;
                default_type application/octet-stream;
                access_log {folder}/nginx-access.log;
                client_body_temp_path {temp}/body;
                proxy_temp_path {temp}/proxy;
                fastcgi_temp_path {temp}/fastcgi;
                uwsgi_temp_path {temp}/uwsgi;
                scgi_temp_path {temp}/scgi;
                client_max_body_size 20m;
                server {{
                    listen 127.0.0.1:{port};
                    root {docroot};
                    index index.php doku.php;
                    location / {{
                        try_files $uri $uri/ /index.php?$args;
                    }}
                    location ~ [^/]\\.php(/|$) {{
                        fastcgi_split_path_info ^(.+?\\.php)(/.*)$;
                        if (!-f $document_root$fastcgi_script_name) {{ return 404; }}
                        include /etc/nginx/fastcgi_params;
                        # Debian's fastcgi_params sends $host, without the port: WordPress would redirect
                        # every page to its own URL with the port (the home URL).
                        fastcgi_param HTTP_HOST $http_host;
                        fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;
                        fastcgi_param PATH_INFO $fastcgi_path_info;
                        fastcgi_pass unix:{sock};
                    }}
                }}
            }}
            """
        ),
        encoding="utf-8",
    )
    nginx_argv = [str(NGINX), "-p", str(folder), "-c", str(nginx_conf), "-e", str(folder / "nginx-error.log")]
    nginx = Service(f"{name}-nginx", nginx_argv, port=port, log_dir=folder, probe=_answers)
    return [fpm_service, nginx]


def _unix_socket(path: Path) -> bool:
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


# --- a running PHP site ---------------------------------------------------------------------------------


@dataclass
class PhpSite:
    """One PHP application, its database and web server(s), told that the gate on ``gate_port`` is public."""

    kind: str
    server: str
    folder: Path
    gate_port: PortReservation
    services: list[Service] = field(default_factory=list)  # started in order, stopped in reverse
    started: list[Service] = field(default_factory=list)
    member_page: str = ""  # the page the person changes
    crawl_start: str = "/"

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.server}"

    @property
    def public_url(self) -> str:
        return f"http://127.0.0.1:{self.gate_port.port}"

    @property
    def public_host(self) -> str:
        return urlsplit(self.public_url).netloc

    @property
    def origin_url(self) -> str:
        return self.services[-1].url

    @property
    def profile(self) -> str:
        return PROFILE[self.kind]

    def start_services(self, services: list[Service]) -> None:
        for service in services:
            self.services.append(service)
            service.start()
            self.started.append(service)

    def logs(self, chars: int = 3000) -> str:
        parts = [f"--- {s.name} ({s.log_path}):\n{s.log_tail(chars)}" for s in self.services]
        for extra in ("php-error.log", "php-fpm-error.log", "nginx-error.log", "mariadb.err"):
            for path in self.folder.rglob(extra):
                with contextlib.suppress(OSError):
                    parts.append(f"--- {path}:\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop()
        self.gate_port.release()


def start(kind: str, server: str, folder: Path) -> PhpSite:
    """Set ``kind`` up in ``folder`` and start it (and its database) served by ``server``."""
    site = PhpSite(kind, server, folder, PortReservation())
    try:
        {"mediawiki": _mediawiki, "wordpress": _wordpress, "dokuwiki": _dokuwiki}[kind](site)
    except BaseException:
        site.stop()
        raise
    return site


def _serve_php(site: PhpSite, docroot: Path, *, router: Path | None = None, env: dict[str, str] | None = None) -> None:
    web = site.folder / site.server
    web.mkdir(parents=True, exist_ok=True)
    port = free_port()
    if site.server == "builtin":
        site.start_services([builtin_server(f"{site.kind}-php-S", docroot, port, web, router=router, env=env)])
    else:
        site.start_services(fpm_and_nginx(site.kind, docroot, port, web, env=env))


def php(*argv: str, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    binary = _php()
    assert binary is not None
    return run([binary, *argv], env=env, timeout=timeout)


# --- MediaWiki ------------------------------------------------------------------------------------------

MW_TOPICS = 120
MW_CATEGORIES = 6
MW_MEMBER_PAGE = "/index.php/Topic_007"


def mw_topic(number: int) -> str:
    return f"Topic {number:03d}"


def _mediawiki(site: PhpSite) -> None:
    folder = site.folder
    config = folder / "LocalSettings.php"
    env = {"MW_CONFIG_FILE": str(config)}
    maintenance = MEDIAWIKI / "maintenance"
    php(
        str(maintenance / "install.php"),
        "--quiet",
        "--skins=Vector",
        "--dbtype=sqlite",
        f"--dbpath={folder / 'data'}",
        f"--confpath={folder}",
        f"--server={site.public_url}",
        "--scriptpath=",
        "--lang=en",
        f"--pass={PASSWORD}",
        "Gate Wiki",
        USER,
        env=env,
    )
    # The gate is the wiki's CDN: MediaWiki trusts its X-Forwarded-For and sends it PURGE requests. The
    # address to trust is an IP alone ($wgCdnServersNoPurge); the one to purge has the gate's port.
    with config.open("a", encoding="utf-8") as settings:
        settings.write(
            textwrap.dedent(
                f"""
                # crawlergate tests
                # One URL layout whatever the server (MediaWiki turns path info off under php-fpm by itself).
                $wgArticlePath = '/index.php/$1';
                $wgUsePathInfo = true;
                $wgUseCdn = true;
                $wgCdnServers = [ '{site.public_host}' ];
                $wgCdnServersNoPurge = [ '127.0.0.1' ];
                $wgUsePrivateIPs = true;
                $wgEnableEmail = false;
                $wgShowExceptionDetails = true;
                $wgJobRunRate = 0;
                $wgDebugLogFile = '{folder}/debug.log';
                $wgDebugLogGroups['squid'] = '{folder}/purge.log';
                """
            )
        )
    pages = folder / "pages"
    pages.mkdir()
    for number in range(1, MW_TOPICS + 1):
        linked = [n for n in (number - 1, number + 1, (number * 7) % MW_TOPICS + 1) if 1 <= n <= MW_TOPICS]
        text = (
            f"'''{mw_topic(number)}''' is an article of the test wiki, number {number}.\n\n"
            f"See also {', '.join(f'[[{mw_topic(n)}]]' for n in linked)}.\n\n"
            f"[[Category:Group {number % MW_CATEGORIES}]]\n"
        )
        (pages / f"{mw_topic(number)}.txt").write_text(text, encoding="utf-8")
    for group in range(MW_CATEGORIES):
        (pages / f"Category:Group {group}.txt").write_text(f"Articles of group {group}.\n", encoding="utf-8")
    listing = "\n".join(f"* [[{mw_topic(n)}]]" for n in range(1, MW_TOPICS + 1))
    (pages / "Main Page.txt").write_text(f"Welcome to the test wiki.\n\n{listing}\n", encoding="utf-8")
    files = sorted(str(path) for path in pages.iterdir())
    php(str(maintenance / "importTextFiles.php"), "--overwrite", "--rc", "-s", "seed", *files, env=env)
    php(str(maintenance / "runJobs.php"), "--quiet", env=env)
    site.member_page = MW_MEMBER_PAGE
    _serve_php(site, MEDIAWIKI, env=env)


# --- WordPress ------------------------------------------------------------------------------------------

WP_POSTS = 110

_WP_CONFIG = """<?php
define('DB_NAME', 'wordpress');
define('DB_USER', 'root');
define('DB_PASSWORD', '');
define('DB_HOST', 'localhost:{socket}');
define('DB_CHARSET', 'utf8mb4');
define('DB_COLLATE', '');
define('WP_HOME', '{public_url}');
define('WP_SITEURL', '{public_url}');
define('AUTH_KEY', 'test-1'); define('SECURE_AUTH_KEY', 'test-2');
define('LOGGED_IN_KEY', 'test-3'); define('NONCE_KEY', 'test-4');
define('AUTH_SALT', 'test-5'); define('SECURE_AUTH_SALT', 'test-6');
define('LOGGED_IN_SALT', 'test-7'); define('NONCE_SALT', 'test-8');
define('WP_AUTO_UPDATE_CORE', false);
define('AUTOMATIC_UPDATER_DISABLED', true);
define('DISABLE_WP_CRON', true);
define('WP_HTTP_BLOCK_EXTERNAL', true);
$table_prefix = 'wp_';
if (!defined('ABSPATH')) {{ define('ABSPATH', __DIR__ . '/'); }}
require_once ABSPATH . 'wp-settings.php';
"""

_WP_SEED = """<?php
// Install WordPress without its web installer, then write the posts the crawl reaches.
define('WP_INSTALLING', true);
$_SERVER['HTTP_HOST'] = '{public_host}';
$_SERVER['REQUEST_URI'] = '/';
function wp_new_blog_notification($blog_title, $blog_url, $user_id, $password) {{}}  // no mail
require '{site}/wp-load.php';
require_once ABSPATH . 'wp-admin/includes/upgrade.php';
wp_install('Gate Blog', '{user}', 'admin@example.org', true, '', '{password}');
switch_theme('twentytwentyone');
global $wp_rewrite;
$wp_rewrite->set_permalink_structure('/%year%/%monthnum%/%postname%/');
update_option('comment_moderation', 0);
update_option('posts_per_page', 5);
$sections = [];
foreach (range(1, 6) as $n) {{ $sections[] = wp_create_category("Section $n"); }}
foreach (range(1, {posts}) as $i) {{
    $id = wp_insert_post([
        'post_title' => sprintf('Post %03d', $i),
        'post_content' => "<p>Body of post $i.</p>",
        'post_status' => 'publish',
        'post_author' => 1,
        'post_category' => [$sections[$i % 6]],
        'tags_input' => ['tag-' . ($i % 9)],
        'post_date' => gmdate('Y-m-d H:i:s', 1700000000 + $i * 86400 * 3),
    ], true);
    if (is_wp_error($id)) {{ fwrite(STDERR, $id->get_error_message()); exit(1); }}
    wp_insert_comment([
        'comment_post_ID' => $id, 'comment_author' => 'Reader', 'comment_author_email' => 'reader@example.org',
        'comment_content' => "First comment on post $i.", 'comment_approved' => 1,
    ]);
}}
flush_rewrite_rules(false);
echo get_permalink(get_page_by_title('Post 007', OBJECT, 'post')), "\\n";
"""

# PHP's built-in server has no rewrites: files are served as they are, everything else goes to WordPress.
_WP_ROUTER = """<?php
$path = parse_url($_SERVER['REQUEST_URI'], PHP_URL_PATH);
$file = $_SERVER['DOCUMENT_ROOT'] . $path;
if (is_file($file)) { return false; }
if (is_dir($file) && is_file(rtrim($file, '/') . '/index.php')) { return false; }
$_SERVER['SCRIPT_NAME'] = '/index.php';
$_SERVER['SCRIPT_FILENAME'] = $_SERVER['DOCUMENT_ROOT'] . '/index.php';
$_SERVER['PHP_SELF'] = '/index.php';
require $_SERVER['DOCUMENT_ROOT'] . '/index.php';
"""


def start_mariadb(folder: Path) -> Service:
    """A mariadbd of its own: data and socket in ``folder``, no TCP, root without a password."""
    data, sock = folder / "data", folder / "mysql.sock"
    user = ["--user=root"] if _running_as_root() else []
    run(
        [
            "mariadb-install-db",
            "--no-defaults",
            f"--datadir={data}",
            *user,
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ],
        timeout=120,
    )
    argv = [
        shutil.which("mariadbd") or "mariadbd",
        "--no-defaults",
        f"--datadir={data}",
        f"--socket={sock}",
        f"--pid-file={folder / 'mariadb.pid'}",
        f"--log-error={folder / 'mariadb.err'}",
        "--skip-networking",
        "--skip-log-bin",
        "--innodb-buffer-pool-size=32M",
        *user,
    ]
    service = Service("mariadbd", argv, port=0, log_dir=folder, probe=lambda _client: _unix_socket(sock))
    return service


def _wordpress(site: PhpSite) -> None:
    folder = site.folder
    database = folder / "mariadb"
    database.mkdir()
    site.start_services([start_mariadb(database)])
    sock = database / "mysql.sock"
    run(["mariadb", "--no-defaults", f"--socket={sock}", "-uroot", "-e", "CREATE DATABASE wordpress"])

    code = folder / "wordpress"
    shutil.copytree(WORDPRESS, code, symlinks=True)
    for debian in ("wp-config.php", ".htaccess"):  # Debian's read /etc/wordpress
        (code / debian).unlink(missing_ok=True)
    (code / "wp-config.php").write_text(_WP_CONFIG.format(socket=sock, public_url=site.public_url), encoding="utf-8")
    seed = folder / "seed.php"
    seed.write_text(
        _WP_SEED.format(public_host=site.public_host, site=code, user=WP_USER, password=PASSWORD, posts=WP_POSTS),
        encoding="utf-8",
    )
    permalink = php(str(seed)).strip().splitlines()[-1]
    assert permalink.startswith(site.public_url + "/"), f"unexpected permalink of Post 007: {permalink!r}"
    site.member_page = permalink[len(site.public_url) :]
    router = folder / "router.php"
    router.write_text(_WP_ROUTER, encoding="utf-8")
    _serve_php(site, code, router=router)


# --- DokuWiki -------------------------------------------------------------------------------------------

DOKU_PAGES = 110


def _dokuwiki(site: PhpSite) -> None:
    """A copy of Debian's DokuWiki whose conf/ and data/ are the folder's own (Debian's point to /etc, /var)."""
    folder = site.folder
    code = folder / "dokuwiki"
    shutil.copytree(DOKUWIKI, code, symlinks=True)
    conf, data = folder / "conf", folder / "data"
    shutil.copytree("/etc/dokuwiki", conf, symlinks=False)
    for sub in (
        "pages/topics",
        "meta",
        "media",
        "attic",
        "cache",
        "index",
        "locks",
        "tmp",
        "media_attic",
        "media_meta",
        "log",
    ):
        (data / sub).mkdir(parents=True, exist_ok=True)
    (code / "inc" / "preload.php").write_text(f"<?php\ndefine('DOKU_CONF', '{conf}/');\n", encoding="utf-8")
    (conf / "local.php").write_text(
        textwrap.dedent(
            f"""\
            <?php
            $conf['savedir'] = '{data}';
            $conf['title'] = 'Gate DokuWiki';
            $conf['useacl'] = 1;
            $conf['superuser'] = '@admin';
            $conf['userewrite'] = 0;
            $conf['baseurl'] = '{site.public_url}';
            $conf['basedir'] = '/';
            $conf['updatecheck'] = 0;
            $conf['send404'] = 1;
            """
        ),
        encoding="utf-8",
    )
    digest = php("-r", f"echo password_hash('{PASSWORD}', PASSWORD_BCRYPT);").strip()
    (conf / "users.auth.php").write_text(f"admin:{digest}:Admin:admin@example.org:admin,user\n", encoding="utf-8")
    (conf / "acl.auth.php").write_text("*\t@ALL\t1\n*\t@user\t8\n", encoding="utf-8")
    listing = "\n".join(f"  * [[topics:page{n:03d}]]" for n in range(1, DOKU_PAGES + 1))
    (data / "pages" / "start.txt").write_text(f"====== Test wiki ======\n\n{listing}\n", encoding="utf-8")
    for n in range(1, DOKU_PAGES + 1):
        (data / "pages" / "topics" / f"page{n:03d}.txt").write_text(
            f"====== Page {n:03d} ======\n\nPage {n} of the test wiki. "
            f"See [[topics:page{(n % DOKU_PAGES) + 1:03d}]].\n",
            encoding="utf-8",
        )
    site.member_page = "/doku.php?id=topics:page007"
    _serve_php(site, code)


# --- forms --------------------------------------------------------------------------------------------


@dataclass
class Form:
    attrs: dict[str, str]
    fields: dict[str, str]

    @property
    def action(self) -> str:
        return self.attrs.get("action", "")


class _Forms(HTMLParser):
    """Every <form> with its successful controls' values (inputs, textareas; submit buttons left out)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.forms: list[Form] = []
        self._textarea: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs_list: list[tuple[str, str | None]]) -> None:
        attrs = {name: value or "" for name, value in attrs_list}
        if tag == "form":
            self.forms.append(Form(attrs, {}))
        elif not self.forms:
            return
        elif tag == "input" and attrs.get("name"):
            kind = attrs.get("type", "text").lower()
            if kind in ("submit", "button", "image", "reset", "file"):
                return
            if kind in ("checkbox", "radio") and "checked" not in attrs:
                return
            self.forms[-1].fields[attrs["name"]] = attrs.get("value", "on" if kind == "checkbox" else "")
        elif tag == "textarea" and attrs.get("name"):
            self._textarea, self._text = attrs["name"], []

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "textarea" and self._textarea is not None and self.forms:
            text = "".join(self._text)
            self.forms[-1].fields[self._textarea] = text[1:] if text.startswith("\n") else text
            self._textarea = None


def form(html: str, **match: str) -> Form:
    """The first form whose attributes contain ``match`` (``id="editform"``, ``action`` substring)."""
    parser = _Forms()
    parser.feed(html)
    parser.close()
    for found in parser.forms:
        if all(
            (value in found.attrs.get(key, "")) if key == "action" else found.attrs.get(key) == value
            for key, value in match.items()
        ):
            return found
    raise AssertionError(f"no form with {match} in the page: {[f.attrs for f in parser.forms]}\n{html[:2000]}")


def link(html: str, pattern: str) -> str:
    """The first href matching ``pattern`` (a regular expression), entities decoded."""
    for href in re.findall(r'href="([^"]+)"', html):
        href = html_module.unescape(href)
        if re.search(pattern, href):
            return href
    raise AssertionError(f"no link matching {pattern!r} in the page:\n{html[:2000]}")
