pub struct LogManager;
pub struct ManagerOptions;
pub struct TopicPartition;
