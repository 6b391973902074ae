# Included by the install step (cmake/install.cmake): makes the package's generated files in
# GEN from the sources in SRC for package version VERSION. Runs at install time (so under cpack),
# which is when the version being packaged is known.

# gzip -9n: maximum compression, no name or timestamp in the header (reproducible; lintian asks).
function(_modeld_gzip in out)
  execute_process(COMMAND gzip -9nc "${in}" OUTPUT_FILE "${out}" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "gzip ${in} failed: ${rc}")
  endif()
endfunction()

function(modeld_generate_package_files src gen version root)
  # The date of the build, as the changelog and man pages show it; SOURCE_DATE_EPOCH wins.
  if(DEFINED ENV{SOURCE_DATE_EPOCH})
    set(epoch "$ENV{SOURCE_DATE_EPOCH}")
  else()
    string(TIMESTAMP epoch "%s" UTC)
  endif()
  execute_process(COMMAND date -u -R -d "@${epoch}" OUTPUT_VARIABLE rfc2822 OUTPUT_STRIP_TRAILING_WHITESPACE)
  execute_process(COMMAND date -u +%Y-%m-%d -d "@${epoch}" OUTPUT_VARIABLE day OUTPUT_STRIP_TRAILING_WHITESPACE)

  # Man pages: @VERSION@ and @DATE@ in the .TH line.
  foreach(page modeld.8 modelctl.1)
    file(READ "${src}/man/${page}" text)
    string(REPLACE "@VERSION@" "${version}" text "${text}")
    string(REPLACE "@DATE@" "${day}" text "${text}")
    file(WRITE "${gen}/${page}" "${text}")
    _modeld_gzip("${gen}/${page}" "${gen}/${page}.gz")
  endforeach()

  # changelog: packaging/changelog, topped by an entry for VERSION when it has none (a package
  # built from the tree between releases, or the test's upgrade package).
  file(READ "${src}/changelog" text)
  string(REGEX MATCH "^modeld \\(([^)]*)\\)" _ "${text}")
  if(NOT CMAKE_MATCH_1 STREQUAL version)
    set(text "modeld (${version}) unstable; urgency=medium

  * Built from the source tree (scripts/package.sh ${version}).

 -- modeld maintainers <maintainers@users.noreply.a-seed-f5081470.example>  ${rfc2822}

${text}")
  endif()
  file(WRITE "${gen}/changelog" "${text}")
  _modeld_gzip("${gen}/changelog" "${gen}/changelog.gz")

  # Model examples: inert by name (the loader reads *.toml only), with a header saying so.
  set(header_kimi "# EXAMPLE, not read by modeld: copy it to kimi-k2-5.toml in this folder to use it,
# then check with `modeld --check-config` and `systemctl reload modeld`.
#
")
  file(READ "${root}/config/models.d/kimi-k2-5.toml" kimi)
  file(WRITE "${gen}/kimi-k2-5.toml.example" "${header_kimi}${kimi}")
  # The .example files carry that header already.
  foreach(example minimax-m2-5 qwen3-235b)
    file(READ "${root}/config/models.d/${example}.toml.example" text)
    file(WRITE "${gen}/${example}.toml.example" "${text}")
  endforeach()
endfunction()
