"""Files and devices: the platform a program is traced for (`target`), the
mesh and its shardings (`sharding`), TensorFlow's start-up lines filtered
(`tf_startup`)."""
