"""Discovery: which servers a task needs and which tools a query means, from the catalog alone.

Pure and in-process: :func:`build_index` turns the catalog into term postings once;
:func:`rank_servers` (``analyze_task``) and :func:`find_tools` (``find_tools``) are a few
look-ups per query. :mod:`.tokens` sizes tool definitions; :mod:`.calibration` turns the
ranking's margins into a calibrated confidence. The evaluation that chose every parameter is
in ``eval/discovery`` (docs/DISCOVERY.md).
"""

from .calibration import Calibration, default_calibration
from .index import DiscoveryIndex, ServiceText, ToolRef, Weights, build_index
from .ranking import ServerRanking, ServerScore, ToolHit, find_tools, rank_servers
from .text import terms

__all__ = [
    "Calibration",
    "DiscoveryIndex",
    "ServerRanking",
    "ServerScore",
    "ServiceText",
    "ToolHit",
    "ToolRef",
    "Weights",
    "build_index",
    "default_calibration",
    "find_tools",
    "rank_servers",
    "terms",
]
