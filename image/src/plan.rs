//! The update planner: `plan(sub tree, sub object cache, image) → UpdateRequest`.
