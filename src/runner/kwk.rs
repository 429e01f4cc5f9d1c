//! The in-tree decoder as a [`super::Runner`], one runner per format.
