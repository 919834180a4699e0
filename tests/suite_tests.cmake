# Writes a ctest file with one test per gtest suite: the tests of SUITE that FILTER selects run
# in one process, as the ctest test "SUITE.*". Run after each build of the test binary, as
# gtest_discover_tests runs its own listing (tests/CMakeLists.txt says why and for which tests).
#
#   cmake -D TEST_BINARY=... -D FILTER=... -D LABELS=... -D TIMEOUT=... -D RESOURCES=...
#         -D LAUNCHER=... -D WORKING_DIR=... -D OUT=... -P suite_tests.cmake
# RESOURCES is each test's RESOURCE_GROUPS (Note [Tests that wait] in tests/CMakeLists.txt);
# LAUNCHER the program that runs each test's command line (Note [Test server]).
foreach(var TEST_BINARY FILTER LABELS TIMEOUT RESOURCES LAUNCHER WORKING_DIR OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "suite_tests.cmake: -D ${var}=... is missing")
  endif()
endforeach()

execute_process(
  COMMAND "${TEST_BINARY}" --gtest_list_tests "--gtest_filter=${FILTER}"
  WORKING_DIRECTORY "${WORKING_DIR}"
  TIMEOUT 60
  OUTPUT_VARIABLE listing
  ERROR_VARIABLE listing_err
  RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "suite_tests.cmake: ${TEST_BINARY} --gtest_list_tests failed (${status}):\n"
    "${listing}${listing_err}")
endif()

# gtest lists a suite as "Suite." (or "Prefix/Suite.  # TypeParam = ..."), then its tests
# indented by two spaces ("  Name", or "  Name/0  # GetParam() = ...").
string(REPLACE ";" "" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(suites "")
set(suite "")
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ #]+)\\.( +#.*)?$")
    set(suite "${CMAKE_MATCH_1}")
    list(APPEND suites "${suite}")
    set("tests_of_${suite}" "")
  elseif(line MATCHES "^  ([^ ]+)" AND NOT suite STREQUAL "")
    list(APPEND "tests_of_${suite}" "${suite}.${CMAKE_MATCH_1}")
  endif()
endforeach()
if(suites STREQUAL "")
  message(FATAL_ERROR "suite_tests.cmake: ${TEST_BINARY} lists no test for ${FILTER}")
endif()

set(script "")
foreach(suite IN LISTS suites)
  list(JOIN "tests_of_${suite}" ":" tests)
  string(APPEND script
    "add_test([==[${suite}.*]==] [==[${LAUNCHER}]==] [==[${TEST_BINARY}]==]"
    " [==[--gtest_filter=${tests}]==])\n"
    "set_tests_properties([==[${suite}.*]==] PROPERTIES WORKING_DIRECTORY [==[${WORKING_DIR}]==]"
    " TIMEOUT ${TIMEOUT} LABELS ${LABELS} RESOURCE_GROUPS ${RESOURCES})\n")
endforeach()
# Written whole, then renamed: ctest never includes half a file.
file(WRITE "${OUT}.tmp" "${script}")
file(RENAME "${OUT}.tmp" "${OUT}")
