//! The Cells a Topology Service knows, looked up as `Classify` and `GetCell` need
//! them.

use crate::config::CellConfig;
use crate::proto::gitlab::cells::topology_service::{CellInfo, SequenceRange};

/// The configured Cells, in configuration order (the first answers `FIRST_CELL`).
#[derive(Clone, Debug)]
pub struct Cells {
    cells: Vec<CellInfo>,
}

impl Cells {
    /// The Cells of `config` (validated: unique ids and session prefixes).
    pub fn new(config: &[CellConfig]) -> Self {
        let cells = config
            .iter()
            .map(|c| {
                let ranges: Vec<SequenceRange> = c
                    .sequence_ranges
                    .iter()
                    .map(|r| SequenceRange {
                        minval: r.minval,
                        maxval: r.maxval,
                    })
                    .collect();
                CellInfo {
                    id: c.id,
                    address: c.address.clone(),
                    session_prefix: c.session_prefix.clone(),
                    // The legacy single range: the first, as GitLab's clients before
                    // `sequence_ranges` read it.
                    sequence_range: ranges.first().copied(),
                    sequence_ranges: ranges,
                }
            })
            .collect();
        Cells { cells }
    }

    /// Every Cell.
    pub fn all(&self) -> &[CellInfo] {
        &self.cells
    }

    /// The Cell with id `id`.
    pub fn by_id(&self, id: i64) -> Option<&CellInfo> {
        self.cells.iter().find(|c| c.id == id)
    }

    /// The Cell whose session ids start with `prefix` (`cell-1`).
    pub fn by_session_prefix(&self, prefix: &str) -> Option<&CellInfo> {
        self.cells.iter().find(|c| c.session_prefix == prefix)
    }

    /// The first Cell: where what no claim places lives.
    pub fn first(&self) -> Option<&CellInfo> {
        self.cells.first()
    }
}
