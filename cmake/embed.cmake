# Files compiled into a target as byte arrays, so the binary serves them without reading anything at run time.
#   clef_embed_files(TARGET OUTPUT_NAME NAMES n1 n2 ... FILES f1 f2 ...)
# adds a generated OUTPUT_NAME.cpp to TARGET defining clef::kEmbeddedFiles (declared in
# src/server/static_routes.h): one {name, data, size} entry per file, named by NAMES in the same order.
# The generation runs cmake/embed_generate.cmake at build time, again whenever a file changes.
function(clef_embed_files target output_name)
  cmake_parse_arguments(E "" "" "NAMES;FILES" ${ARGN})
  list(LENGTH E_NAMES n_names)
  list(LENGTH E_FILES n_files)
  if(NOT n_names EQUAL n_files)
    message(FATAL_ERROR "clef_embed_files: ${n_names} names for ${n_files} files")
  endif()
  set(out ${CMAKE_BINARY_DIR}/generated/${output_name}.cpp)
  string(REPLACE ";" "|" names "${E_NAMES}")
  string(REPLACE ";" "|" files "${E_FILES}")
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} "-DOUT=${out}" "-DNAMES=${names}" "-DFILES=${files}" -P
            ${CMAKE_SOURCE_DIR}/cmake/embed_generate.cmake
    DEPENDS ${E_FILES} ${CMAKE_SOURCE_DIR}/cmake/embed_generate.cmake
    COMMENT "Embedding ${n_files} files into ${output_name}.cpp"
    VERBATIM)
  target_sources(${target} PRIVATE ${out})
endfunction()
