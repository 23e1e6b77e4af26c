#!/usr/bin/env bash
# Fetch Hadoop's mini cluster (a real NameNode + DataNode in one JVM) and the two JUnit
# jars its launcher needs, once, into a cache, and print the directory holding the jars
# (the last line of stdout). The tests' HDFS (tests/fixtures/hdfs.py) puts every jar of
# that directory on a `java -cp`. Versions are pinned here and nowhere else: Hadoop
# matches the hadoop-client-api jar that pyspark ships (pyspark 4.2.0: 3.5.0), so the
# driver's FileSystem client and the cluster speak the same release.
#
# `org.apache.hadoop.test.MiniDFSClusterManager` dies on a missing JUnit class without
# junit:junit and junit-jupiter-api on the class path. Nothing is committed; Maven's
# local repository (~/.m2) keeps its own copy. Idempotent: a complete cache is reused
# (the `.complete` marker is written last). Offline afterwards.
#
# Environment: AIRFLOW_CKPT_CACHE (default ~/.cache/airflow-ckpt), MVN (default mvn).
# `--version` prints the pinned Hadoop version.
set -euo pipefail
HADOOP_VERSION=3.5.0
JUNIT4_VERSION=4.13.2
JUNIT_JUPITER_VERSION=5.14.1
cache_root="${AIRFLOW_CKPT_CACHE:-$HOME/.cache/airflow-ckpt}"
out_dir="$cache_root/jars/hadoop-minicluster/$HADOOP_VERSION"
if [ "${1:-}" = "--version" ]; then echo "$HADOOP_VERSION"; exit 0; fi
if [ -f "$out_dir/.complete" ]; then echo "$out_dir"; exit 0; fi
mvn="${MVN:-mvn}"
command -v "$mvn" >/dev/null || {
  echo "ERROR: Maven ($mvn) is required to fetch hadoop-client-minicluster $HADOOP_VERSION once" \
       "(apt-get install maven); the HDFS tests are skipped without it" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/hadoop-jars.XXXXXX")
trap 'rm -rf "$work"' EXIT
cat >"$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.airflowckpt</groupId><artifactId>hadoop-jars</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-client-minicluster</artifactId><version>$HADOOP_VERSION</version></dependency>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-client-api</artifactId><version>$HADOOP_VERSION</version></dependency>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-client-runtime</artifactId><version>$HADOOP_VERSION</version></dependency>
    <dependency><groupId>junit</groupId><artifactId>junit</artifactId><version>$JUNIT4_VERSION</version></dependency>
    <dependency><groupId>org.junit.jupiter</groupId><artifactId>junit-jupiter-api</artifactId><version>$JUNIT_JUPITER_VERSION</version></dependency>
  </dependencies>
</project>
POM
mkdir -p "$out_dir"
echo "fetching hadoop-client-minicluster $HADOOP_VERSION into $out_dir (once)" >&2
if ! (cd "$work" && "$mvn" -q -B dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$out_dir" >&2); then
  echo "ERROR: could not fetch hadoop-client-minicluster $HADOOP_VERSION from Maven Central" \
       "(offline? see the Maven output above); the HDFS tests are skipped without it" >&2
  exit 1
fi
touch "$out_dir/.complete"
echo "$out_dir"
