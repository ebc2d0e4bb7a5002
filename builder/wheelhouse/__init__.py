"""The wheelhouse: publish, index, verify, repair, prune, lock, serve and provision.

Everything here runs on the build host (or the host serving the wheelhouse); what runs on nodes
is builder/node/, which publish builds into one file in tools/ (wheelhouse.installer).
"""

from builder.wheelhouse.index import IndexEntry, parse_links, project_page, root_page, write_index
from builder.wheelhouse.layout import MANIFEST, load_manifest
from builder.wheelhouse.prune import prune
from builder.wheelhouse.publish import passing_report, publish
from builder.wheelhouse.upkeep import repair
from builder.wheelhouse.verify import verify

__all__ = [
    "MANIFEST",
    "IndexEntry",
    "load_manifest",
    "parse_links",
    "passing_report",
    "project_page",
    "prune",
    "publish",
    "repair",
    "root_page",
    "verify",
    "write_index",
]
