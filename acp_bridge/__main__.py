from __future__ import annotations

from acp_bridge.cli.main import main

raise SystemExit(main())
