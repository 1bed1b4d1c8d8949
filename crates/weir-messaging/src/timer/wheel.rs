//! The timer store's index: which scheduled message (by its offset in the timer log) is due
//! when. Two levels, as a hierarchical timing wheel has:
//!
//! - **Far: minute slots on disk.** Every entry is appended to the file of its slot,
//!   `<slot start ms>.slot` ([`SLOT_MS`] wide), 16 bytes each: the due time and the timer-log
//!   offset, both big-endian i64. A slot file is never rewritten; it is deleted once every
//!   entry in it has fired. Of the slots not loaded only a count and the smallest offset are
//!   held in memory, so a week of scheduled messages costs 10,080 small structs of RAM, not one
//!   entry each.
//! - **Near: an ordered set in memory.** A slot is loaded into it [`LOOKAHEAD_MS`] before it
//!   starts; entries added to a loaded slot go to both the file and the set. Firing takes the
//!   set's smallest keys. Memory is bounded by what falls due within about two slots.
//!
//! Keys are `(due ms, offset)`, fired in that order; `fired` is the largest key fired, and
//! every key at or below it is done. **Invariant:** an entry added after a key was fired sorts
//! above it: its due time is raised to `fired.0` when it is earlier (a message scheduled for a
//! time already past fires at once), and its offset is larger than any fired one (offsets grow
//! with scheduling). So a restart that skips every key `<= fired` skips exactly what fired.
//!
//! These are asserted in debug builds by `Wheel::check_invariants` after every change: no
//! key waiting in memory is at or below `fired` (else it would be handed out again, or skipped
//! by a restart), `fired` never goes back, a key handed to `Wheel::fired` was above it, and
//! every key in memory belongs to a loaded slot (so none fires, and moves `fired`, before the
//! rest of its slot's file is read).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// The width of a far slot. A week of delays is 10,080 slot files.
pub const SLOT_MS: i64 = 60_000;
/// How long before its start a slot is loaded into memory.
pub const LOOKAHEAD_MS: i64 = 5_000;
/// One entry in a slot file (and one note in the recall file): the due time and the offset,
/// both big-endian i64.
pub(super) const ENTRY_BYTES: usize = 16;

pub(super) fn encode_entry((due, offset): Key) -> [u8; ENTRY_BYTES] {
    let mut bytes = [0u8; ENTRY_BYTES];
    bytes[..8].copy_from_slice(&due.to_be_bytes());
    bytes[8..].copy_from_slice(&offset.to_be_bytes());
    bytes
}

/// The key of an entry of [`ENTRY_BYTES`] bytes.
pub(super) fn decode_entry(entry: &[u8]) -> Key {
    let mut due = [0u8; 8];
    let mut offset = [0u8; 8];
    due.copy_from_slice(&entry[..8]);
    offset.copy_from_slice(&entry[8..ENTRY_BYTES]);
    (i64::from_be_bytes(due), i64::from_be_bytes(offset))
}

/// A due time and a timer-log offset.
pub type Key = (i64, i64);

/// What is held in memory of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    entries: u64,
    min_offset: i64,
}

#[derive(Debug)]
pub(crate) struct Wheel {
    dir: PathBuf,
    /// Every slot with an entry not fired yet, by start.
    slots: BTreeMap<i64, Slot>,
    /// The entries of the loaded slots that have not fired.
    near: BTreeSet<Key>,
    /// Slots starting below this are loaded.
    loaded_until: i64,
    /// While slots load (between [`Wheel::begin_advance`] and [`Wheel::install`]): where they
    /// start. Their entries are not all in memory yet.
    loading_from: Option<i64>,
    fired: Key,
}

fn slot_of(due_ms: i64) -> i64 {
    due_ms.div_euclid(SLOT_MS) * SLOT_MS
}

impl Wheel {
    /// Opens the slot files in `dir`; everything at or below `fired` is done. Loads the slots
    /// due by `now_ms` + [`LOOKAHEAD_MS`].
    #[cfg(test)]
    pub fn open(dir: &Path, fired: Key, now_ms: i64) -> io::Result<Wheel> {
        Ok(Self::open_noting(dir, fired, now_ms, i64::MAX)?.0)
    }

    /// [`Wheel::open`], also returning the offsets at or above `from` that the files hold: a
    /// log tail indexed again after a crash must not add them twice.
    pub(crate) fn open_noting(dir: &Path, fired: Key, now_ms: i64, from: i64) -> io::Result<(Wheel, HashSet<i64>)> {
        let mut noted = HashSet::new();
        fs::create_dir_all(dir)?;
        let mut slots = BTreeMap::new();
        for entry in fs::read_dir(dir)? {
            let path = entry?.path();
            let Some(start) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".slot"))
                .and_then(|n| n.parse::<i64>().ok())
            else {
                continue;
            };
            let entries: Vec<Key> = read_slot(&path)?.into_iter().filter(|k| *k > fired).collect();
            noted.extend(entries.iter().map(|(_, offset)| *offset).filter(|offset| *offset >= from));
            match entries.iter().map(|(_, offset)| *offset).min() {
                Some(min_offset) => {
                    slots.insert(start, Slot { entries: entries.len() as u64, min_offset });
                }
                None => fs::remove_file(&path)?,
            }
        }
        let mut wheel = Wheel {
            dir: dir.to_path_buf(),
            slots,
            near: BTreeSet::new(),
            loaded_until: i64::MIN,
            loading_from: None,
            fired,
        };
        wheel.advance(now_ms)?;
        Ok((wheel, noted))
    }

    fn path(&self, slot: i64) -> PathBuf {
        self.dir.join(format!("{slot}.slot"))
    }

    /// Adds entries (due ms, offset). Returns the keys as stored: a key that would sort at or
    /// below the last fired one has its due time raised above it (it is due already).
    pub fn add(&mut self, entries: &[Key]) -> io::Result<Vec<Key>> {
        let mut by_slot: BTreeMap<i64, Vec<Key>> = BTreeMap::new();
        let mut keys = Vec::with_capacity(entries.len());
        for &(due, offset) in entries {
            // Normally the offset alone puts it above (offsets grow); after a crash the log's
            // tail may be indexed again, and must then sort above too.
            let mut key = (due.max(self.fired.0), offset);
            if key <= self.fired {
                key.0 = self.fired.0.saturating_add(1);
            }
            by_slot.entry(slot_of(key.0)).or_default().push(key);
            keys.push(key);
        }
        for (slot, keys) in by_slot {
            let mut bytes = Vec::with_capacity(keys.len() * ENTRY_BYTES);
            for key in &keys {
                bytes.extend_from_slice(&encode_entry(*key));
            }
            OpenOptions::new().create(true).append(true).open(self.path(slot))?.write_all(&bytes)?;
            let info = self.slots.entry(slot).or_insert(Slot { entries: 0, min_offset: i64::MAX });
            info.entries += keys.len() as u64;
            info.min_offset = info.min_offset.min(keys.iter().map(|k| k.1).min().unwrap_or(i64::MAX));
            if slot < self.loaded_until {
                self.near.extend(keys);
            }
        }
        self.check_invariants(self.fired);
        Ok(keys)
    }

    /// Loads the slots that start by `now_ms` + [`LOOKAHEAD_MS`], all at once: the
    /// [`Wheel::begin_advance`], [`load_slots`], [`Wheel::install`] steps without letting go.
    pub fn advance(&mut self, now_ms: i64) -> io::Result<()> {
        let paths = self.begin_advance(now_ms);
        let loaded = load_slots(&paths)?;
        self.install(loaded);
        Ok(())
    }

    /// The first step of loading the slots that start by `now_ms` + [`LOOKAHEAD_MS`]: from
    /// here on, entries added to them go to memory too. Returns their files, for
    /// [`load_slots`] to read without holding up the wheel (a minute slot can hold a million
    /// entries: reading and sorting them took 400 ms), and then [`Wheel::install`].
    ///
    /// An entry added between the two steps is in memory and in the file: installing it again
    /// changes nothing (the near entries are a set). None fires in between: a slot is loaded
    /// [`LOOKAHEAD_MS`] before it starts, and a due time already past was raised into a slot
    /// loaded before.
    pub(crate) fn begin_advance(&mut self, now_ms: i64) -> Vec<(i64, PathBuf)> {
        let horizon = slot_of(now_ms.saturating_add(LOOKAHEAD_MS)) + SLOT_MS;
        if horizon <= self.loaded_until {
            return Vec::new();
        }
        let slots: Vec<(i64, PathBuf)> =
            self.slots.range(self.loaded_until..horizon).map(|(slot, _)| (*slot, self.path(*slot))).collect();
        if let Some((first, _)) = slots.first() {
            self.loading_from = Some(self.loading_from.map_or(*first, |from| from.min(*first)));
        }
        self.loaded_until = horizon;
        self.check_invariants(self.fired);
        slots
    }

    /// The slots of a [`Wheel::begin_advance`] could not be read: they are loaded next time.
    ///
    /// The entries added to them meanwhile leave memory too (they are in the files, and come
    /// back with the next load): a key fired from a slot whose file was not read would move the
    /// fired mark past that file's entries, which would then never fire.
    pub(crate) fn abort_advance(&mut self, slots: &[(i64, PathBuf)]) {
        if let Some(first) = slots.iter().map(|(slot, _)| *slot).min() {
            self.loaded_until = self.loaded_until.min(first);
            drop(self.near.split_off(&(self.loaded_until, i64::MIN)));
        }
        self.loading_from = None;
        self.check_invariants(self.fired);
    }

    /// The last step of loading slots: their entries, from [`load_slots`], join those in memory.
    pub fn install(&mut self, mut loaded: BTreeSet<Key>) {
        let fired = self.fired;
        loaded.retain(|key| *key > fired);
        // A merge of two sorted sets: linear, no search per entry.
        self.near.append(&mut loaded);
        self.loading_from = None;
        self.check_invariants(self.fired);
    }

    /// Whether the entry `key`, which was added (the timer log says so), waits to fire. Of a
    /// slot not loaded only the count is known, so there a key never added may be answered
    /// pending too. (A key whose due time [`Wheel::add`] raised is not found under its first
    /// due time: it was due already.)
    pub fn is_pending(&self, key: Key) -> bool {
        if key <= self.fired {
            return false;
        }
        let slot = slot_of(key.0);
        let in_memory = slot < self.loaded_until && self.loading_from.is_none_or(|from| slot < from);
        if in_memory {
            self.near.contains(&key)
        } else {
            // Nothing fires from a slot not loaded: its entries all wait.
            self.slots.contains_key(&slot)
        }
    }

    /// The key of the entry for `offset` due at `due_ms`, if it waits: (due, offset), or the
    /// key [`Wheel::add`] raised it to when it came due already (in memory then: due at once).
    pub(crate) fn pending_key_of(&self, due_ms: i64, offset: i64) -> Option<Key> {
        if self.is_pending((due_ms, offset)) {
            return Some((due_ms, offset));
        }
        self.near.iter().find(|key| key.1 == offset && key.0 > due_ms).copied()
    }

    /// The first at most `limit` keys due at `now_ms`, in order.
    #[cfg(test)]
    pub fn due(&self, now_ms: i64, limit: usize) -> Vec<Key> {
        self.due_where(now_ms, limit, |_| true)
    }

    /// [`Wheel::due`] of the keys `wanted` takes (the others wait for a retry).
    pub(crate) fn due_where(&self, now_ms: i64, limit: usize, wanted: impl Fn(&Key) -> bool) -> Vec<Key> {
        self.near.iter().take_while(|(due, _)| *due <= now_ms).filter(|k| wanted(k)).take(limit).copied().collect()
    }

    /// When the wheel next has something to do: the first near key, or the load of the next
    /// far slot.
    #[cfg(test)]
    pub(crate) fn next_wake_ms(&self) -> Option<i64> {
        self.next_wake_ms_where(|_| true)
    }

    /// [`Wheel::next_wake_ms`] counting only the near keys `wanted` takes.
    pub(crate) fn next_wake_ms_where(&self, wanted: impl Fn(&Key) -> bool) -> Option<i64> {
        let near = self.near.iter().find(|k| wanted(k)).map(|(due, _)| *due);
        let far = self.slots.range(self.loaded_until..).next().map(|(slot, _)| slot - LOOKAHEAD_MS);
        near.into_iter().chain(far).min()
    }

    /// `keys` fired (each was due and in memory); every key up to `through` is done, for the
    /// record that survives a restart. Deletes the slot files wholly fired.
    pub fn fired(&mut self, keys: &[Key], through: Key) -> io::Result<()> {
        let fired_before = self.fired;
        if cfg!(debug_assertions) {
            if let Some(again) = keys.iter().find(|key| **key <= fired_before) {
                panic!(
                    "{}: key {again:?} fired again (every key up to {fired_before:?} fired already)",
                    self.dir.display()
                );
            }
        }
        for key in keys {
            if self.near.remove(key) {
                if let Some(info) = self.slots.get_mut(&slot_of(key.0)) {
                    info.entries = info.entries.saturating_sub(1);
                }
            }
        }
        // A key added while its round was firing (scheduled for a time that passed meanwhile)
        // can sort below `through` without having fired: the mark stops just below it, or a
        // restart would skip it and a recall would find it not pending.
        let through = match self.near.first() {
            Some(first) if *first <= through => (first.0, first.1.saturating_sub(1)),
            _ => through,
        };
        if through > self.fired {
            self.fired = through;
        }
        // A slot whose every entry fired, or that ends at or below the fired due time, is done.
        // (An emptied slot stays until then: `entries` counts what was in memory only.)
        let done: Vec<i64> = self
            .slots
            .iter()
            .filter(|(slot, info)| *slot + SLOT_MS <= self.fired.0 || (info.entries == 0 && **slot < self.loaded_until))
            .map(|(slot, _)| *slot)
            .collect();
        for slot in done {
            let first_unfired = self.near.range((slot, i64::MIN)..(slot + SLOT_MS, i64::MIN)).next().is_some();
            if first_unfired {
                continue;
            }
            self.slots.remove(&slot);
            match fs::remove_file(self.path(slot)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        self.check_invariants(fired_before);
        Ok(())
    }

    /// Asserts the invariants of the module doc (debug builds only; nothing in release), after
    /// a change that found `fired` at `fired_before`. Cheap: the ends of the ordered set only.
    fn check_invariants(&self, fired_before: Key) {
        if !cfg!(debug_assertions) {
            return;
        }
        let dir = self.dir.display();
        assert!(
            self.fired >= fired_before,
            "{dir}: the fired mark went back from {fired_before:?} to {:?}",
            self.fired
        );
        if let Some(first) = self.near.first() {
            assert!(
                *first > self.fired,
                "{dir}: key {first:?} waits in memory at or below the fired mark {:?}: it would fire twice, or a restart would skip it",
                self.fired
            );
        }
        for key in self.near.first().into_iter().chain(self.near.last()) {
            assert!(
                self.slots.contains_key(&slot_of(key.0)),
                "{dir}: key {key:?} waits in memory but its slot is not counted (the log could be trimmed under it)"
            );
        }
        if let Some(last) = self.near.last() {
            assert!(
                slot_of(last.0) < self.loaded_until,
                "{dir}: key {last:?} waits in memory but its slot is not loaded (from {}): it could fire before the rest of its slot is read",
                self.loaded_until
            );
        }
    }

    /// The largest key fired.
    pub(crate) fn fired_through(&self) -> Key {
        self.fired
    }

    /// An offset at or below the smallest timer-log offset some entry still needs: below it
    /// the log may go. Every entry not fired belongs to a slot of `slots`, whose `min_offset`
    /// (not raised as its entries fire) is at or below the entry's, so this looks at the slots
    /// only, never at the entries in memory.
    pub(crate) fn min_pending_offset(&self) -> Option<i64> {
        self.slots.values().map(|s| s.min_offset).min()
    }

    /// How many entries wait, about: those of the slots not loaded and those in memory.
    pub fn pending(&self) -> u64 {
        let far: u64 = self.slots.range(self.loaded_until..).map(|(_, s)| s.entries).sum();
        far + self.near.len() as u64
    }

    /// How many entries are in memory.
    pub fn in_memory(&self) -> usize {
        self.near.len()
    }
}

/// The entries of the slot files `paths`, as one set (built in bulk from sorted entries).
pub(crate) fn load_slots(slots: &[(i64, PathBuf)]) -> io::Result<BTreeSet<Key>> {
    let mut entries = Vec::new();
    for (_, path) in slots {
        entries.extend(read_slot(path)?);
    }
    entries.sort_unstable();
    Ok(entries.into_iter().collect())
}

/// The entries of a slot file; a torn last entry (a crash mid-write) is left out.
fn read_slot(path: &Path) -> io::Result<Vec<Key>> {
    let mut bytes = Vec::new();
    match File::open(path) {
        Ok(mut file) => file.read_to_end(&mut bytes)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(bytes.chunks_exact(ENTRY_BYTES).map(decode_entry).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NONE: Key = (i64::MIN, i64::MIN);

    #[test]
    fn far_entries_stay_on_disk_until_their_slot_comes_near() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wheel = Wheel::open(dir.path(), NONE, 0).expect("open");
        wheel.add(&[(1_000, 1), (3_600_000, 2), (500, 3)]).expect("add");
        assert_eq!(wheel.in_memory(), 2, "the hour-away entry is not held in memory");
        assert_eq!(wheel.due(999, 10), vec![(500, 3)]);
        assert_eq!(wheel.next_wake_ms(), Some(500));
        wheel.fired(&[(500, 3), (1_000, 1)], (1_000, 1)).expect("fire");
        assert_eq!(wheel.next_wake_ms(), Some(3_600_000 - LOOKAHEAD_MS), "wakes to load the far slot");
        wheel.advance(3_600_000 - LOOKAHEAD_MS).expect("advance");
        assert_eq!(wheel.due(3_600_000, 10), vec![(3_600_000, 2)]);
        assert_eq!(wheel.min_pending_offset(), Some(2));
    }

    #[test]
    fn a_reopened_wheel_has_exactly_what_did_not_fire_and_a_late_entry_fires_after_the_last_fired() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let mut wheel = Wheel::open(dir.path(), NONE, 0).expect("open");
            wheel.add(&[(100, 1), (200, 2), (200, 3), (90_000, 4)]).expect("add");
            wheel.fired(&[(100, 1), (200, 2)], (200, 2)).expect("fire");
            // Scheduled for a time already fired past: it fires next, never skipped.
            assert_eq!(wheel.add(&[(50, 5)]).expect("add"), vec![(200, 5)]);
        }
        let mut torn = OpenOptions::new().append(true).open(dir.path().join("0.slot")).expect("slot");
        torn.write_all(&[1, 2, 3]).expect("torn entry");
        let wheel = Wheel::open(dir.path(), (200, 2), 0).expect("reopen");
        assert_eq!(wheel.due(100_000, 10), vec![(200, 3), (200, 5)]);
        assert_eq!(wheel.pending(), 3);
    }

    #[test]
    fn an_entry_added_while_its_slot_loads_is_there_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wheel = Wheel::open(dir.path(), NONE, 0).expect("open");
        wheel.add(&[(120_000, 1), (130_000, 2)]).expect("add");
        let paths = wheel.begin_advance(120_000 - LOOKAHEAD_MS);
        assert_eq!(paths.len(), 1);
        wheel.add(&[(125_000, 3)]).expect("add while loading");
        let loaded = load_slots(&paths).expect("load");
        wheel.install(loaded);
        assert_eq!(wheel.due(200_000, 10), vec![(120_000, 1), (125_000, 3), (130_000, 2)]);
    }

    #[test]
    fn an_entry_is_pending_from_its_add_to_its_firing_also_while_its_slot_loads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wheel = Wheel::open(dir.path(), NONE, 0).expect("open");
        wheel.add(&[(1_000, 1), (120_000, 2)]).expect("add");
        assert!(wheel.is_pending((1_000, 1)) && wheel.is_pending((120_000, 2)));
        assert!(!wheel.is_pending((1_000, 2)), "not added so (in memory: known)");
        assert!(!wheel.is_pending((7_200_000, 9)), "no such slot");
        // Between the two steps of a load, the far entry is not in memory yet: still pending.
        let paths = wheel.begin_advance(120_000 - LOOKAHEAD_MS);
        assert!(wheel.is_pending((120_000, 2)));
        wheel.install(load_slots(&paths).expect("load"));
        assert!(wheel.is_pending((120_000, 2)));
        wheel.fired(&[(1_000, 1)], (1_000, 1)).expect("fire");
        assert!(!wheel.is_pending((1_000, 1)));
        wheel.fired(&[(120_000, 2)], (1_000, 1)).expect("fire out of order");
        assert!(!wheel.is_pending((120_000, 2)), "fired, though not below the fired mark");
    }

    #[test]
    fn a_wholly_fired_slot_file_is_deleted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wheel = Wheel::open(dir.path(), NONE, 0).expect("open");
        wheel.add(&[(100, 1), (61_000, 2)]).expect("add");
        wheel.advance(61_000).expect("advance");
        wheel.fired(&[(100, 1)], (100, 1)).expect("fire");
        assert!(!dir.path().join("0.slot").exists());
        assert!(dir.path().join("60000.slot").exists());
        wheel.fired(&[(61_000, 2)], (61_000, 2)).expect("fire");
        assert!(!dir.path().join("60000.slot").exists());
        assert_eq!((wheel.pending(), wheel.min_pending_offset()), (0, None));
    }

    #[test]
    fn a_key_added_while_its_round_fires_keeps_the_fired_mark_below_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wheel = Wheel::open(dir.path(), NONE, 0).expect("open");
        wheel.add(&[(200, 1), (300, 2)]).expect("add");
        let round = wheel.due(300, 10);
        assert_eq!(round, vec![(200, 1), (300, 2)]);
        // Scheduled while the round was out, for a time that has passed since: it sorts below
        // the round's last key, and has not fired.
        assert_eq!(wheel.add(&[(150, 3)]).expect("add"), vec![(150, 3)]);
        wheel.fired(&round, (300, 2)).expect("fire");
        assert!(wheel.fired_through() < (150, 3), "a restart must not skip it: {:?}", wheel.fired_through());
        assert!(wheel.is_pending((150, 3)));
        assert_eq!(wheel.due(300, 10), vec![(150, 3)]);
        let reopened = Wheel::open(dir.path(), wheel.fired_through(), 300).expect("reopen");
        assert!(reopened.due(300, 10).contains(&(150, 3)), "still there after a restart");
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "fired again")]
    fn a_key_fired_twice_is_caught() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wheel = Wheel::open(dir.path(), NONE, 0).expect("open");
        wheel.add(&[(100, 1), (200, 2)]).expect("add");
        wheel.fired(&[(100, 1)], (100, 1)).expect("fire");
        let _ = wheel.fired(&[(100, 1)], (100, 1));
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "at or below the fired mark")]
    fn a_waiting_key_at_or_below_the_fired_mark_is_caught() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wheel = Wheel::open(dir.path(), NONE, 0).expect("open");
        wheel.add(&[(100, 1), (200, 2)]).expect("add");
        wheel.fired = (150, 9);
        wheel.check_invariants(NONE);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "went back")]
    fn a_fired_mark_that_goes_back_is_caught() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wheel = Wheel::open(dir.path(), NONE, 0).expect("open");
        wheel.add(&[(100, 1)]).expect("add");
        wheel.check_invariants((50, 0));
    }

    #[test]
    fn an_aborted_load_fires_nothing_of_its_slots_until_they_are_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wheel = Wheel::open(dir.path(), NONE, 0).expect("open");
        wheel.add(&[(120_000, 1), (130_000, 2)]).expect("add");
        let paths = wheel.begin_advance(120_000 - LOOKAHEAD_MS);
        // Added while the slot loads: in memory and in the file.
        wheel.add(&[(125_000, 3)]).expect("add while loading");
        wheel.abort_advance(&paths);
        assert_eq!(wheel.due(200_000, 10), vec![], "nothing of a slot not read fires");
        assert!(wheel.is_pending((120_000, 1)) && wheel.is_pending((125_000, 3)));
        wheel.advance(120_000).expect("load again");
        assert_eq!(wheel.due(200_000, 10), vec![(120_000, 1), (125_000, 3), (130_000, 2)]);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "its slot is not loaded")]
    fn a_waiting_key_of_a_slot_not_loaded_is_caught() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wheel = Wheel::open(dir.path(), NONE, 0).expect("open");
        wheel.add(&[(100, 1)]).expect("add");
        wheel.loaded_until = 0;
        wheel.check_invariants(NONE);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "its slot is not counted")]
    fn a_waiting_key_of_an_uncounted_slot_is_caught() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wheel = Wheel::open(dir.path(), NONE, 0).expect("open");
        wheel.add(&[(100, 1)]).expect("add");
        wheel.slots.clear();
        wheel.check_invariants(NONE);
    }

    proptest! {
        /// Whatever the schedule and however often the wheel is reopened, each entry fires
        /// once, never before it is due, and in key order.
        #[test]
        fn every_entry_fires_once_in_order_and_never_early(
            dues in proptest::collection::vec(0i64..400_000, 1..120),
            reopen_every in 1usize..40,
            step in 1_000i64..90_000,
        ) {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut wheel = Wheel::open(dir.path(), NONE, 0).expect("open");
            let mut now = 0;
            let mut fired: Vec<Key> = Vec::new();
            let mut added = Vec::new();
            let mut next_offset = 0;
            let mut rounds = 0;
            let mut pending_adds = dues.clone();
            while now < 600_000 {
                // Add a few entries (relative to now: some in the past).
                for due in pending_adds.drain(..pending_adds.len().min(7)) {
                    next_offset += 1;
                    added.extend(wheel.add(&[(due, next_offset)]).expect("add"));
                }
                wheel.advance(now).expect("advance");
                let due = wheel.due(now, 5);
                for key in &due {
                    prop_assert!(key.0 <= now, "fired early");
                }
                if let Some(last) = due.last().copied() {
                    wheel.fired(&due, last).expect("fire");
                    fired.extend(due);
                }
                rounds += 1;
                if rounds % reopen_every == 0 {
                    let through = wheel.fired_through();
                    wheel = Wheel::open(dir.path(), through, now).expect("reopen");
                }
                if wheel.due(now, 1).is_empty() {
                    now += step;
                }
            }
            let mut sorted = fired.clone();
            sorted.sort();
            prop_assert_eq!(&fired, &sorted, "fired out of order");
            added.sort();
            prop_assert_eq!(fired, added, "every entry fired exactly once");
        }
    }
}
