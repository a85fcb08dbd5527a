//! Distributed values: [`PerReplica`].

/// One value per local replica, in replica order (TF's `PerReplica`): what
/// [`crate::Strategy::run`] returns and a distributed dataset yields.
///
/// ```
/// use ferroflow_distribute::PerReplica;
/// let v = PerReplica::new(vec![1, 2]);
/// assert_eq!((v.len(), v.values()[1]), (2, 2));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PerReplica<T> {
    values: Vec<T>,
}

impl<T> PerReplica<T> {
    /// The values of the local replicas, in replica order.
    pub fn new(values: Vec<T>) -> PerReplica<T> {
        PerReplica { values }
    }
    /// The values, in replica order (`experimental_local_results`).
    pub fn values(&self) -> &[T] {
        &self.values
    }
    /// The values, owned.
    pub fn into_values(self) -> Vec<T> {
        self.values
    }
    /// How many local replicas.
    pub fn len(&self) -> usize {
        self.values.len()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}
