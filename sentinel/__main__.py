from __future__ import annotations

from sentinel.cli import main

raise SystemExit(main())
