from __future__ import annotations

from crawlergate.cli import main

raise SystemExit(main())
