//! corral-store: durable state behind one trait, with SQLite as the embedded default.
