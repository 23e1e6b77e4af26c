#!/usr/bin/env bash
# Spark 4 needs Java 17 or newer on PATH (or JAVA_HOME). Fail early with a clear message.
set -euo pipefail
java_bin="java"
if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then java_bin="$JAVA_HOME/bin/java"; fi
if ! command -v "$java_bin" >/dev/null 2>&1; then
  echo "ERROR: Java 17+ is required by Spark 4 but no 'java' was found." >&2
  echo "       Install it (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) or set JAVA_HOME." >&2
  exit 1
fi
version=$("$java_bin" -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
major=${version%%.*}
if [ "$major" = "1" ]; then major=$(echo "$version" | cut -d. -f2); fi
if ! [ "$major" -ge 17 ] 2>/dev/null; then
  echo "ERROR: Spark 4 needs Java 17+, found Java '$version' ($java_bin)." >&2
  echo "       Install openjdk-17 and put it first on PATH or set JAVA_HOME." >&2
  exit 1
fi
echo "java $version ok"
