//! From numbers to the fix: the findings over a snapshot of the JSON API, pure (the same
//! snapshot always gives the same findings). `backlogd doctor` prints them, the JSON API
//! serves them (`/api/v1/findings`) and `top` shows them next to their listener: so they
//! live here, apart from any one of those.

mod backlog;
pub mod finding;
pub mod findings;
#[cfg(test)]
pub mod tests;
